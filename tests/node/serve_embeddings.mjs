// tlm serve --embeddings --pooling mean through the official `openai` package: embeddings.create
// with a string, an array of strings and token ids, as floats (the package asks for base64 and
// decodes it unless told otherwise) and as explicit floats, against the vectors the server
// returned to curl. Usage: node serve_embeddings.mjs BASE_URL EXPECTED_JSON (the server's answer
// to three inputs, the first the text below).
import fs from "node:fs";
import OpenAI from "openai";

const [base, expectedFile] = process.argv.slice(2);
const expected = JSON.parse(fs.readFileSync(expectedFile, "utf8")).data.map((d) => d.embedding);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0, timeout: 30000 });
const text = "Once upon a time, there was a little girl named Lily.";
let failures = 0;
function check(cond, what) {
  if (!cond) {
    failures++;
    console.error("FAIL: " + what);
  }
}
const near = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-6);

// the package's default: base64 on the wire, decoded into numbers
let r = await client.embeddings.create({ model: "stories", input: text });
check(r.object === "list" && r.data.length === 1 && r.data[0].index === 0, "one embedding: " + JSON.stringify(r).slice(0, 200));
check(Array.isArray(r.data[0].embedding) && near(r.data[0].embedding, expected[0]), "base64 decoded to the server's floats");
check(r.usage.prompt_tokens > 10 && r.usage.total_tokens === r.usage.prompt_tokens, "usage: " + JSON.stringify(r.usage));

r = await client.embeddings.create({ model: "stories", input: [text, "The cat sat on the mat.", ""], encoding_format: "float" });
check(r.data.length === 3 && r.data.every((d, i) => d.index === i && near(d.embedding, expected[i])), "three inputs as floats");

// token ids: the text's own ids give its vector
const ids = (await (await fetch(base + "/tokenize", { method: "POST", body: JSON.stringify({ content: text, add_special: true }) })).json()).tokens;
r = await client.embeddings.create({ model: "stories", input: ids, encoding_format: "float" });
check(near(r.data[0].embedding, expected[0]), "token ids give the text's vector");

// a refusal is the package's BadRequestError
try {
  await client.embeddings.create({ model: "stories", input: [] });
  check(false, "an empty input list was accepted");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError, "empty input: " + e);
}
if (failures) process.exit(1);
console.log("serve_embeddings.mjs: ok");
