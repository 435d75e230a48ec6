// tlm serve through the official `openai` package and plain fetch: chat and completions,
// streamed and not, the models list, errors as the package's error types, cancellation, and a
// bounded load test. Usage: node serve_clients.mjs BASE_URL API_KEY SERVER_PID GREEDY_TEXT_FILE
// [RSS_SLACK_KIB] (how much the server's RSS may grow between two identical load rounds;
// AddressSanitizer's quarantine needs far more than the default 8 MiB)
import fs from "node:fs";
import OpenAI from "openai";

const [base, apiKey, pid, greedyFile, slackArg] = process.argv.slice(2);
const rssSlack = Number(slackArg || 8192);
const greedy = fs.readFileSync(greedyFile, "utf8");
const client = new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries: 0, timeout: 30000 });
let failures = 0;
function check(cond, what) {
  if (!cond) {
    failures++;
    console.error("FAIL: " + what);
  }
}
async function metrics() {
  const text = await (await fetch(base + "/metrics", { headers: { Authorization: "Bearer " + apiKey } })).text();
  const get = (name) => Number((text.match(new RegExp("^" + name + " (\\S+)$", "m")) || [])[1]);
  return { busy: get("tlm_slots_busy"), queued: get("tlm_queue_depth"), text };
}
async function idle() {
  for (let i = 0; i < 100; i++) {
    const m = await metrics();
    if (m.busy === 0 && m.queued === 0) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}
function rss() {
  const s = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  return Number(s.match(/VmRSS:\s+(\d+)/)[1]);
}

// Models.
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === "stories260K.gguf", "models list: " + JSON.stringify(models.data));

// Completions: greedy text is tlm generate's, streamed or not.
const prompt = "Once upon a time";
const comp = await client.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0 });
check(comp.object === "text_completion" && comp.choices[0].finish_reason === "length", "completion shape");
check(greedy.startsWith(comp.choices[0].text) && comp.choices[0].text.length > 20,
  `completion text ${JSON.stringify(comp.choices[0].text)} is not tlm generate's ${JSON.stringify(greedy)}`);
check(comp.usage.completion_tokens === 24 && comp.usage.prompt_tokens === 5 &&
  comp.usage.total_tokens === 29, "completion usage " + JSON.stringify(comp.usage));
let streamed = "", chunks = 0, usage = null;
for await (const ch of await client.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0,
  stream: true, stream_options: { include_usage: true } })) {
  chunks++;
  if (ch.choices.length) streamed += ch.choices[0].text;
  if (ch.usage) usage = ch.usage;
}
check(streamed === comp.choices[0].text && chunks >= 3, `streamed completion ${JSON.stringify(streamed)} in ${chunks} chunks`);
check(usage && usage.completion_tokens === 24 && usage.prompt_tokens_details.cached_tokens === 4,
  "the last chunk's usage reports the cached prefix: " + JSON.stringify(usage));

// Stop strings cut exactly: never a byte of the stop string, even streamed.
const word = "little";
const at = comp.choices[0].text.indexOf(word);
check(at > 0, "the greedy text holds 'little'");
const stopped = await client.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0, stop: [word, "zzz"] });
check(stopped.choices[0].text === comp.choices[0].text.slice(0, at) && stopped.choices[0].finish_reason === "stop",
  "stop: " + JSON.stringify(stopped.choices[0]));
let sst = "";
for await (const ch of await client.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0, stop: word, stream: true }))
  if (ch.choices.length) sst += ch.choices[0].text;
check(sst === comp.choices[0].text.slice(0, at), "streamed stop: " + JSON.stringify(sst));

// Chat: streamed deltas add up to the whole message; logprobs; n choices.
const messages = [{ role: "system", content: "You tell stories." }, { role: "user", content: "Tell me about a cat." }];
const chat = await client.chat.completions.create({ model: "m", messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 2 });
const msg = chat.choices[0].message;
check(chat.object === "chat.completion" && msg.role === "assistant" && msg.content.length > 0, "chat shape");
const lp = chat.choices[0].logprobs.content;
check(lp.length === 16 && lp.every((t) => t.logprob <= 0 && t.top_logprobs.length === 2 && t.top_logprobs[0].token === t.token),
  "chat logprobs");
let deltas = "", role = null, finish = null;
for await (const ch of await client.chat.completions.create({ model: "m", messages, max_tokens: 16, temperature: 0, stream: true })) {
  const d = ch.choices[0];
  if (d.delta.role) role = d.delta.role;
  if (d.delta.content) deltas += d.delta.content;
  if (d.finish_reason) finish = d.finish_reason;
}
check(deltas === msg.content && role === "assistant" && finish === "length", `chat stream ${JSON.stringify(deltas)} vs ${JSON.stringify(msg.content)}`);
const two = await client.chat.completions.create({ model: "m", messages, max_tokens: 8, temperature: 1, seed: 5, n: 2 });
check(two.choices.length === 2 && two.choices[1].index === 1 && two.usage.completion_tokens === 16, "n = 2");
const again = await client.chat.completions.create({ model: "m", messages, max_tokens: 8, temperature: 1, seed: 5, n: 2 });
check(again.choices[0].message.content === two.choices[0].message.content &&
  again.choices[1].message.content === two.choices[1].message.content, "a seed reproduces");

// Errors surface as the package's types.
async function expectError(fn, type, status, what) {
  try {
    await fn();
    check(false, what + ": no error");
  } catch (e) {
    check(e instanceof type && e.status === status && typeof e.message === "string", `${what}: ${e.constructor.name} ${e.status} ${e.message}`);
  }
}
await expectError(() => client.completions.create({ model: "m", prompt, max_tokens: -3 }), OpenAI.BadRequestError, 400, "negative max_tokens");
await expectError(() => client.chat.completions.create({ model: "m", messages: [{ role: "wizard", content: "x" }] }), OpenAI.BadRequestError, 400, "bad role");
await expectError(() => client.completions.create({ model: "m", prompt: "x".repeat(3000) }), OpenAI.BadRequestError, 400, "prompt longer than the context");
await expectError(() => new OpenAI({ baseURL: base + "/v1", apiKey: "wrong", maxRetries: 0 }).models.list(), OpenAI.AuthenticationError, 401, "wrong key");
await expectError(() => client.get("/nothing/here"), OpenAI.NotFoundError, 404, "unknown path");

// A client that goes away frees its slot.
const ac = new AbortController();
const res = await fetch(base + "/v1/completions", { method: "POST", signal: ac.signal,
  headers: { Authorization: "Bearer " + apiKey, "Content-Type": "application/json" },
  body: JSON.stringify({ prompt, max_tokens: 100000, stream: true }) });
const reader = res.body.getReader();
await reader.read();
ac.abort();
check(await idle(), "an aborted stream leaves its slot");

// Load: 16 clients, 6 requests each, every kind of request in the mix (plain and streamed
// completions and chats, a JSON Schema, a required tool call, llama-server's /completion with a
// grammar and n_probs); none fails, each answer has the shape asked for, the server ends idle and
// its memory does not grow between rounds.
const loadSchema = { type: "object", properties: { pick: { enum: ["red", "green"] }, n: { type: "integer" } }, required: ["pick", "n"], additionalProperties: false };
const loadTools = [{ type: "function", function: { name: "count", parameters: { type: "object", properties: { to: { enum: [3, 5] } }, required: ["to"] } } }];
const whole = { json: 0, tools: 0 }; /* answers complete enough to check their shape */
async function loadRequest(c, k) {
  const temperature = (c + k) % 3 ? 1 : 0;
  switch ((c + k) % 6) {
    case 0: {
      const r = await client.completions.create({ model: "m", prompt: `Tom had ${c} ${k}`, max_tokens: 12, temperature });
      return r.usage.completion_tokens >= 1;
    }
    case 1: {
      let n = 0;
      for await (const ch of await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: `Story ${c} ${k}` }], max_tokens: 12, stream: true, temperature }))
        if (ch.choices.length && ch.choices[0].delta.content) n++;
      return n > 0;
    }
    case 2: {
      const r = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: `Pick ${c}` }], max_tokens: 48, temperature, seed: c * 8 + k,
        response_format: { type: "json_schema", json_schema: { name: "p", schema: loadSchema } } });
      if (r.choices[0].finish_reason !== "stop") return true; /* cut at max_tokens: nothing to parse */
      whole.json++;
      const o = JSON.parse(r.choices[0].message.content);
      return ["red", "green"].includes(o.pick) && Number.isInteger(o.n) && Object.keys(o).length === 2;
    }
    case 3: {
      const r = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: `Count ${k}` }], max_tokens: 96, temperature, seed: c * 8 + k, tools: loadTools, tool_choice: "required", parallel_tool_calls: false });
      const ch = r.choices[0];
      if (ch.finish_reason === "length") return true;
      whole.tools++;
      return ch.finish_reason === "tool_calls" && ch.message.tool_calls.length >= 1 &&
        ch.message.tool_calls.every((t) => t.function.name === "count" && [3, 5].includes(JSON.parse(t.function.arguments).to));
    }
    case 4: {
      const res = await fetch(base + "/completion", { method: "POST", headers: { Authorization: "Bearer " + apiKey, "Content-Type": "application/json" },
        body: JSON.stringify({ prompt: `Lily saw ${c}`, n_predict: 8, grammar: 'root ::= ("yes" | "no") " " [a-z]+', n_probs: 2, temperature }) });
      const j = await res.json();
      return res.status === 200 && /^(yes|no) [a-z]*$/.test(j.content) && j.completion_probabilities.length === j.tokens_predicted;
    }
    default: {
      let text = "";
      for await (const ch of await client.completions.create({ model: "m", prompt: `Sam ran ${k}`, max_tokens: 12, stream: true, logit_bias: { "13": -100 } }))
        if (ch.choices.length) text += ch.choices[0].text;
      return text.length > 0;
    }
  }
}
async function round() {
  let failed = 0;
  await Promise.all(Array.from({ length: 16 }, async (_, c) => {
    for (let k = 0; k < 6; k++) {
      try {
        if (!(await loadRequest(c, k))) {
          failed++;
          console.error(`load: request ${c} ${k} (kind ${(c + k) % 6}) answered out of shape`);
        }
      } catch (e) {
        failed++;
        console.error("load: " + e.message);
      }
    }
  }));
  return failed;
}
check((await round()) === 0, "load round 1 has failures");
const rss1 = rss();
check((await round()) === 0, "load round 2 has failures");
const rss2 = rss();
check(whole.json >= 8 && whole.tools >= 8, `too few whole answers to check: ${JSON.stringify(whole)}`);
check(await idle(), "idle after the load");
check(rss2 - rss1 < rssSlack, `RSS grew from ${rss1} to ${rss2} KiB between identical rounds`);
const m = await metrics();
check(/tlm_requests_total\{status="200"\} \d+/.test(m.text) && /tlm_completion_tokens_total [1-9]/.test(m.text), "metrics counters");
check(/tlm_prompt_cache_hits_total \d+/.test(m.text) && /tlm_prompt_cache_bytes \d+/.test(m.text) &&
  /tlm_prompt_cache_entries \d+/.test(m.text), "prompt cache gauges in /metrics");

if (failures) {
  console.error(`${failures} failures`);
  process.exit(1);
}
console.log("serve_clients: all passed");
