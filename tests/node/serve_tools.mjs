// Tool calls through the official `openai` package: a required call made well-formed by the
// grammar (name and arguments as the schema says), the same call streamed, a named function, a
// call -> tool result -> answer loop, and tool_choice none. Usage: node serve_tools.mjs BASE_URL
// [mistral] (a server in Mistral's format, whose call ids are 9 letters and digits)
import OpenAI from "openai";

const [base, format] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0, timeout: 60000 });
let failures = 0;
function check(cond, what) {
  if (!cond) {
    failures++;
    console.error("FAIL: " + what);
  }
}
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["c", "f"] } },
        required: ["city", "unit"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add",
      description: "Adds two integers",
      parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"] },
    },
  },
];
function validCall(c) {
  if (c.type !== "function" || typeof c.id !== "string" || !c.id) return false;
  if (format === "mistral" && !/^[a-zA-Z0-9]{9}$/.test(c.id)) return false;
  const args = JSON.parse(c.function.arguments);
  if (c.function.name === "get_weather")
    return typeof args.city === "string" && args.city.length <= 12 && ["c", "f"].includes(args.unit) && Object.keys(args).length === 2;
  if (c.function.name === "add") return Number.isInteger(args.a) && Number.isInteger(args.b) && Object.keys(args).length === 2;
  return false;
}
const messages = [{ role: "user", content: "What is the weather in Paris?" }];

// Required: the model (which knows nothing of tools) must call, and the call must parse and fit
// its schema; one call, so the grammar ends the answer after it.
for (let seed = 1; seed <= 8; seed++) {
  const r = await client.chat.completions.create({
    model: "m", messages, tools, tool_choice: "required", parallel_tool_calls: false, temperature: 1, seed, max_tokens: 200,
  });
  const ch = r.choices[0];
  const calls = ch.message.tool_calls || [];
  check(ch.finish_reason === "tool_calls", `seed ${seed}: finish_reason ${ch.finish_reason}`);
  check(calls.length === 1 && calls.every(validCall), `seed ${seed}: calls ${JSON.stringify(calls)}`);
}
// Parallel calls allowed: every complete call parses (the model may run on to max_tokens).
const par = await client.chat.completions.create({
  model: "m", messages, tools, tool_choice: "required", temperature: 1, seed: 9, max_tokens: 120,
});
const pc = par.choices[0].message.tool_calls || [];
check(pc.length >= 1 && pc.every(validCall), "parallel calls: " + JSON.stringify(pc));

// A named function, without parallel calls: exactly one call of it.
const named = await client.chat.completions.create({
  model: "m", messages, tools, tool_choice: { type: "function", function: { name: "add" } },
  parallel_tool_calls: false, temperature: 1, seed: 3, max_tokens: 120,
});
const nc = named.choices[0].message.tool_calls || [];
check(nc.length === 1 && nc[0].function.name === "add" && validCall(nc[0]), "named: " + JSON.stringify(nc));

// Streamed: the deltas add up to the same calls as the whole answer with the same seed.
const whole = await client.chat.completions.create({
  model: "m", messages, tools, tool_choice: "required", parallel_tool_calls: false, temperature: 1, seed: 5, max_tokens: 200,
});
const stream = await client.chat.completions.create({
  model: "m", messages, tools, tool_choice: "required", parallel_tool_calls: false, temperature: 1, seed: 5, max_tokens: 200, stream: true,
});
const got = [];
let finish = null;
for await (const chunk of stream) {
  const d = chunk.choices[0]?.delta || {};
  for (const t of d.tool_calls || []) {
    got[t.index] = got[t.index] || { id: "", type: "function", function: { name: "", arguments: "" } };
    if (t.id) got[t.index].id = t.id;
    if (t.function?.name) got[t.index].function.name += t.function.name;
    if (t.function?.arguments) got[t.index].function.arguments += t.function.arguments;
  }
  if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
}
const wc = whole.choices[0].message.tool_calls || [];
check(finish === "tool_calls", "stream finish_reason " + finish);
check(got.length === wc.length && got.every((c, i) => c.function.name === wc[i].function.name && c.function.arguments === wc[i].function.arguments),
  "stream " + JSON.stringify(got) + " vs whole " + JSON.stringify(wc));

// The loop: call, the tool's result back, then an answer (auto: free text is allowed).
const first = whole.choices[0].message;
const follow = [
  ...messages,
  first,
  ...first.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: '{"temperature": 21}' })),
];
const answer = await client.chat.completions.create({ model: "m", messages: follow, tools, temperature: 0, max_tokens: 16 });
check(answer.choices.length === 1 && ["stop", "length", "tool_calls"].includes(answer.choices[0].finish_reason),
  "answer after the tool result: " + JSON.stringify(answer.choices[0]));

// none: plain text, no calls parsed.
const none = await client.chat.completions.create({ model: "m", messages, tools, tool_choice: "none", temperature: 0, max_tokens: 8 });
check(!none.choices[0].message.tool_calls && typeof none.choices[0].message.content === "string", "none: " + JSON.stringify(none.choices[0]));

// A tool_choice naming no tool is a 400.
try {
  await client.chat.completions.create({ model: "m", messages, tools, tool_choice: { type: "function", function: { name: "nope" } } });
  check(false, "an unknown tool_choice was accepted");
} catch (e) {
  check(e.status === 400 && /nope/.test(e.message), "unknown tool_choice error: " + e.message);
}
if (failures) process.exit(1);
console.log("tool calls: ok");
