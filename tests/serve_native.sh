#!/usr/bin/env bash
# llama-server's own API on tlm serve, with the requests its documentation shows: POST /completion
# (prompt as text, ids or both; n_predict, stop, n_probs, return_tokens, logit_bias, ignore_eos,
# stream, samplers tlm lacks refused), its answer's fields, /props, /apply-template, /v1/health,
# /tokenize's pieces, /metrics' llamacpp: names, /slots with save, erase and restore, its command
# line; logit_bias on the OpenAI endpoint too; and tool calls with the openai npm client
# (tests/node/serve_tools.mjs), in the Hermes format (ChatML) and in Llama 3.1's.
. "$(dirname "$0")/lib.sh"
M=$DATA/models/stories260K.gguf
need "$M"

mkdir -p "$TMP/slots"
"$TLM" serve -m "$M" --port 0 -t 1 --parallel 2 --ctx 1024 --slot-save-path "$TMP/slots" \
    >"$TMP/serve.out" 2>"$TMP/serve.err" &
PID=$!
T_PIDS+=("$PID")
listening() { URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/serve.out"); [ -n "$URL" ]; }
wait_until 10 listening || { cat "$TMP/serve.err" >&2; die "the server did not start"; }
post() { # PATH BODY: the answer in $TMP/body, the status printed
    curl -s -o "$TMP/body" -w '%{http_code}' -X POST "$URL$1" -H "Content-Type: application/json" -d "$2"
}
j() { json_get "$1" "$TMP/body"; }

# Greedy: the same text as tlm generate and as the OpenAI endpoint.
"$TLM" generate -m "$M" -p "Once upon a time" -n 24 --temp 0 2>/dev/null | tail -c +17 >"$TMP/greedy"
expect "/completion" [ "$(post /completion '{"prompt": "Once upon a time", "n_predict": 24, "temperature": 0}')" = 200 ]
expect "content is tlm generate's greedy text" [ "$(j 'j["content"]')" = "$(cat "$TMP/greedy")" ]
expect "stop: true, stop_type limit" [ "$(j '[j["stop"], j["stop_type"], j["stopping_word"]]')" = '[true, "limit", ""]' ]
expect "tokens_predicted 24" [ "$(j 'j["tokens_predicted"]')" = 24 ]
expect "tokens empty without return_tokens" [ "$(j 'j["tokens"]')" = '[]' ]
n_prompt=$("$TLM" generate -m "$M" -p "Once upon a time" -n 0 --print-ids 2>/dev/null | wc -w)
expect "tokens_evaluated is the prompt's $n_prompt tokens" [ "$(j 'j["tokens_evaluated"]')" = "$n_prompt" ]
expect "timings" [ "$(j 'sorted(k for k in j["timings"] if k.startswith(("prompt", "predicted")))')" = \
    '["predicted_ms", "predicted_n", "predicted_per_second", "predicted_per_token_ms", "prompt_ms", "prompt_n", "prompt_per_second", "prompt_per_token_ms"]' ]
expect "timings count the tokens" [ "$(j 'j["timings"]["predicted_n"]')" = 24 ]
expect "generation_settings echo the request" [ "$(j '[j["generation_settings"]["n_predict"], j["generation_settings"]["n_ctx"]]')" = '[24, 1024]' ]
expect "the prompt as given" [ "$(j 'j["prompt"]')" = "Once upon a time" ]
post /v1/completions '{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}' >/dev/null
expect "the OpenAI endpoint gives the same text" [ "$(j 'j["choices"][0]["text"]')" = "$(cat "$TMP/greedy")" ]

# return_tokens, and /detokenize of them
post /completion '{"prompt": "Once upon a time", "n_predict": 10, "temperature": 0, "return_tokens": true}' >/dev/null
toks=$(j 'j["tokens"]')
content=$(j 'j["content"]')
expect "return_tokens: 10 ids" [ "$(j 'len(j["tokens"])')" = 10 ]
post /detokenize "{\"tokens\": $toks}" >/dev/null
expect "the ids detokenize to the content" [ "$(j 'j["content"]')" = "$content" ]

# a stop word: cut before it, named
word=$(cut -c 12-17 "$TMP/greedy")
post /completion "{\"prompt\": \"Once upon a time\", \"n_predict\": 24, \"temperature\": 0, \"stop\": [\"$word\"]}" >/dev/null
expect "stop_type word, stopping_word '$word'" [ "$(j '[j["stop_type"], j["stopping_word"]]')" = "[\"word\", \"$word\"]" ]
expect "content cut before the stop word" [ "$(j 'j["content"]')" = "$(cut -c 1-11 "$TMP/greedy")" ]

# n_probs: one entry per token, the greedy token first among its alternatives
post /completion '{"prompt": "Once upon a time", "n_predict": 5, "temperature": 0, "n_probs": 3}' >/dev/null
expect "completion_probabilities: one per token" [ "$(j 'len(j["completion_probabilities"])')" = 5 ]
expect "3 alternatives, the chosen one first" [ "$(j 'all(len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"] and p["logprob"] <= 0 for p in j["completion_probabilities"])')" = true ]

# the prompt as ids and text together
ids=$("$TLM" generate -m "$M" -p "Once upon" -n 0 --print-ids 2>/dev/null | tr ' ' ',')
expect "a prompt of ids and text" [ "$(post /completion "{\"prompt\": [$ids, \" a time\"], \"n_predict\": 4, \"temperature\": 0}")" = 200 ]
expect "ids and text count as the prompt's tokens" [ "$(j 'j["tokens_evaluated"]')" -ge "$n_prompt" ]

# logit_bias: false bans the greedy first token, on both APIs
post /completion '{"prompt": "Once upon a time", "n_predict": 1, "temperature": 0, "return_tokens": true}' >/dev/null
first=$(j 'j["tokens"][0]')
post /completion "{\"prompt\": \"Once upon a time\", \"n_predict\": 1, \"temperature\": 0, \"return_tokens\": true, \"logit_bias\": [[$first, false]]}" >/dev/null
expect "logit_bias false bans token $first" [ "$(j 'j["tokens"][0]')" != "$first" ]
post /v1/completions "{\"prompt\": \"Once upon a time\", \"max_tokens\": 3, \"temperature\": 0, \"logit_bias\": {\"$first\": -100}}" >/dev/null
expect "OpenAI's logit_bias object on /v1/completions" [ "$(j 'j["choices"][0]["text"]')" != "$(head -c 3 "$TMP/greedy")" ]
expect "a logit_bias id outside the vocabulary" [ "$(post /completion '{"prompt": "a", "logit_bias": [[99999, 1]]}')" = 400 ]

# ignore_eos: generation runs to n_predict
expect "ignore_eos" [ "$(post /completion '{"prompt": "Once upon a time", "n_predict": 300, "temperature": 0, "ignore_eos": true}')" = 200 ]
expect "ignore_eos runs to the context or n_predict" [ "$(j 'j["stop_type"]')" = limit ]

# streaming: events of content, then one with stop: true; no [DONE]
curl -sN -X POST "$URL/completion" -d '{"prompt": "Once upon a time", "n_predict": 24, "temperature": 0, "stream": true}' >"$TMP/sse"
/usr/bin/python3 - "$TMP/sse" "$TMP/greedy" >"$TMP/sse.check" <<'PY'
import json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
text = "".join(e["content"] for e in ev)
ok = (ev and ev[-1]["stop"] is True and all(e["stop"] is False for e in ev[:-1])
      and text == open(sys.argv[2]).read() and ev[-1]["tokens_predicted"] == 24
      and sum(len(e["tokens"]) for e in ev) == 24 and "timings" in ev[-1])
print("ok" if ok else "bad: %r" % ev[-3:])
PY
expect "stream: the greedy text, then stop: true ($(cat "$TMP/sse.check"))" [ "$(cat "$TMP/sse.check")" = ok ]
grep -q DONE "$TMP/sse" && bad "[DONE] in llama-server's stream" || ok

# samplers tlm lacks are refused unless off; its samplers list picks tlm's
expect "mirostat refused" [ "$(post /completion '{"prompt": "a", "mirostat": 2}')" = 400 ]
expect "naming it" grep -q "'mirostat' is not supported" "$TMP/body"
expect "mirostat 0 accepted" [ "$(post /completion '{"prompt": "a", "n_predict": 1, "mirostat": 0, "typical_p": 1, "dry_multiplier": 0, "cache_prompt": true, "post_sampling_probs": false}')" = 200 ]
expect "an unknown sampler name refused" [ "$(post /completion '{"prompt": "a", "samplers": ["top_k", "magic"]}')" = 400 ]

# the other endpoints
expect "/props" [ "$(curl -s -o "$TMP/body" -w '%{http_code}' "$URL/props")" = 200 ]
expect "/props: slots and context" [ "$(j '[j["total_slots"], j["default_generation_settings"]["n_ctx"]]')" = '[2, 1024]' ]
expect "/apply-template" [ "$(post /apply-template '{"messages": [{"role": "user", "content": "hi"}]}')" = 200 ]
expect "the chat prompt, assistant turn open" [ "$(j 'j["prompt"]')" = "$(printf '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n')" ]
expect "/v1/health" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/health")" = 200 ]
expect "/tokenize with_pieces" [ "$(post /tokenize '{"content": "Once upon a time", "with_pieces": true}')" = 200 ]
expect "the pieces spell the text" [ "$(j '"".join(t["piece"] for t in j["tokens"]).strip()')" = "Once upon a time" ]
expect "ids beside the pieces" [ "$(j 'all(isinstance(t["id"], int) for t in j["tokens"])')" = true ]
post /tokenize "$(printf '{"content": "\xc3\xa1", "with_pieces": true}')" >/dev/null
expect "a piece that is part of a character is its bytes (llama-server's example)" [ "$(j '[t["piece"] for t in j["tokens"]][-2:]')" = '[[195], [161]]' ]
curl -s "$URL/metrics" >"$TMP/metrics"
for name in prompt_tokens_total prompt_seconds_total tokens_predicted_total tokens_predicted_seconds_total \
    predicted_tokens_seconds requests_processing requests_deferred n_decode_total n_busy_slots_per_decode; do
    grep -q "^llamacpp:$name " "$TMP/metrics" && ok || bad "/metrics lacks llama-server's llamacpp:$name"
done
expect "llamacpp:tokens_predicted_total counts what was generated" [ "$(sed -n 's/^llamacpp:tokens_predicted_total //p' "$TMP/metrics")" -gt 24 ]

# /slots: a slot's cache saved, erased and restored; the restored cache serves the same prompt
P='{"prompt": "Once upon a time there was a dog", "n_predict": 6, "temperature": 0}'
post /completion "$P" >/dev/null
k=$(j 'j["id_slot"]')
first=$(j 'j["content"]')
curl -s "$URL/slots" >"$TMP/body"
n=$(j "j[$k][\"n_tokens\"]")
expect "GET /slots: slot $k holds the request's $n positions, idle" [ "$(j "[j[$k]['is_processing'], j[$k]['n_tokens'] > 8]")" = '[false, true]' ]
expect "save" [ "$(post "/slots/$k?action=save" '{"filename": "dog.bin"}')" = 200 ]
expect "n_saved $n" [ "$(j '[j["n_saved"], j["filename"]]')" = "[$n, \"dog.bin\"]" ]
expect "the file is in --slot-save-path" [ -s "$TMP/slots/dog.bin" ]
expect "erase" [ "$(post "/slots/$k?action=erase" '{}')" = 200 ]
expect "n_erased $n" [ "$(j 'j["n_erased"]')" = "$n" ]
expect "the slot is empty" [ "$(curl -s "$URL/slots" | json_get "j[$k]['n_tokens']")" = 0 ]
expect "restore" [ "$(post "/slots/$k?action=restore" '{"filename": "dog.bin"}')" = 200 ]
expect "n_restored $n" [ "$(j 'j["n_restored"]')" = "$n" ]
expect "the restored slot holds them" [ "$(curl -s "$URL/slots" | json_get "j[$k]['n_tokens']")" = "$n" ]
post /completion "$P" >/dev/null
expect "the restored cache serves the prompt (tokens_cached $(j 'j["tokens_cached"]'))" [ "$(j 'j["tokens_cached"] > 8')" = true ]
expect "and the same text" [ "$(j 'j["content"]')" = "$first" ]
expect "a file name with a directory refused" [ "$(post "/slots/0?action=save" '{"filename": "../x"}')" = 400 ]
expect "a missing file refused" [ "$(post "/slots/0?action=restore" '{"filename": "none.bin"}')" = 400 ]
printf 'not a slot at all, but long enough to have a header......' >"$TMP/slots/junk.bin"
expect "a file that is no slot refused" [ "$(post "/slots/0?action=restore" '{"filename": "junk.bin"}')" = 400 ]
expect "naming the problem" grep -q "not a saved slot" "$TMP/body"
expect "an unknown action refused" [ "$(post "/slots/0?action=fly" '{}')" = 400 ]
expect "a slot the server lacks refused" [ "$(post "/slots/7?action=erase" '{}')" = 400 ]

# Tool calls through the official openai package (the Hermes format of ChatML models)
expect "tool calls with the openai client" node_run serve_tools.mjs "$URL"

# llama-server's command line: its flags for the requests' defaults take effect, the ones that
# mean nothing here are accepted
kill "$PID"
wait "$PID" 2>/dev/null
"$TLM" serve -m "$M" --port 0 -t 1 --ctx-size 128 --alias stories -n 7 --temp 0 --top-k 1 \
    --seed 5 -ngl 99 --batch-size 512 -ub 512 --flash-attn auto --metrics --slots --jinja -cb \
    --no-webui >"$TMP/serve2.out" 2>"$TMP/serve2.err" &
PID=$!
T_PIDS+=("$PID")
URL=
listening2() { URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/serve2.out" 2>/dev/null); [ -n "$URL" ]; }
wait_until 10 listening2 || { cat "$TMP/serve2.err" >&2; die "llama-server's flags refused"; }
post /completion '{"prompt": "Once upon a time"}' >/dev/null
expect "--n-predict 7 and --temp 0 are the defaults" [ "$(j '[j["tokens_predicted"], j["content"]]')" = "$(/usr/bin/python3 -c 'import json,sys; print(json.dumps([7, open(sys.argv[1]).read()[:len(sys.argv[2])]]))' "$TMP/greedy" "$(j 'j["content"]')")" ]
expect "--alias names the model" [ "$(j 'j["model"]')" = stories ]
expect "--ctx-size is the context" [ "$(j 'j["generation_settings"]["n_ctx"]')" = 128 ]
expect "a request's own value wins" [ "$(post /completion '{"prompt": "Once upon a time", "n_predict": 3}')" = 200 ]
expect "n_predict 3 over --n-predict 7" [ "$(j 'j["tokens_predicted"]')" = 3 ]
expect "/props shows the defaults" [ "$(curl -s "$URL/props" | json_get '[j["default_generation_settings"]["params"][k] for k in ("n_predict", "temperature", "top_k", "seed")]')" = '[7, 0, 1, 5]' ]
expect "--no-webui: no page at /" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/")" = 404 ]
expect "no --slot-save-path: saving is refused" [ "$(post "/slots/0?action=save" '{"filename": "a.bin"}')" = 501 ]

# Tool calls in Llama 3.1's format (--chat-template llama3) through the same openai client loop:
# the required and named calls come out of the grammar as {"name", "parameters"} objects
kill "$PID"
wait "$PID" 2>/dev/null
"$TLM" serve -m "$M" --port 0 -t 1 --ctx 2048 --parallel 2 --chat-template llama3 >"$TMP/serve3.out" 2>"$TMP/serve3.err" &
PID=$!
T_PIDS+=("$PID")
URL=
listening3() { URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/serve3.out" 2>/dev/null); [ -n "$URL" ]; }
wait_until 10 listening3 || { cat "$TMP/serve3.err" >&2; die "the llama3 server did not start"; }
expect "Llama 3 tool calls with the openai client" node_run serve_tools.mjs "$URL"

# Tool calls in Mistral Nemo's format (--chat-template mistral-nemo): [AVAILABLE_TOOLS] in the
# prompt, the grammar's call arrays, ids of 9 letters and digits carried into [TOOL_RESULTS]
kill "$PID"
wait "$PID" 2>/dev/null
"$TLM" serve -m "$M" --port 0 -t 1 --ctx 2048 --parallel 2 --chat-template mistral-nemo >"$TMP/serve4.out" 2>"$TMP/serve4.err" &
PID=$!
T_PIDS+=("$PID")
URL=
listening4() { URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/serve4.out" 2>/dev/null); [ -n "$URL" ]; }
wait_until 10 listening4 || { cat "$TMP/serve4.err" >&2; die "the mistral-nemo server did not start"; }
expect "Mistral tool calls with the openai client" node_run serve_tools.mjs "$URL" mistral
post /apply-template '{"messages": [{"role": "user", "content": "hi"}]}' >/dev/null
expect "the mistral-nemo template" [ "$(j 'j["prompt"]')" = "<s>[INST]hi[/INST]" ]
post /v1/chat/completions '{"messages": [{"role": "user", "content": "W?"}, {"role": "tool", "tool_call_id": "c1", "content": "1"}], "max_tokens": 2}' >/dev/null
expect "a call id Mistral's template refuses is a 400" grep -q "9 letters and digits" "$TMP/body"
finish
