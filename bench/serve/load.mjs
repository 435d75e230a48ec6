// Streams C concurrent /v1/completions requests at an OpenAI-compatible server and reports the
// aggregate generated tok/s (over the wall time, and over each stream's decoding alone) and the
// inter-token latency (p50, p99 over every gap of every stream, and each stream's own p99),
// then the time to first token of a 400-token prompt and of its next turn (prefix reuse).
// Usage: node load.mjs BASE_URL CONCURRENCY TOKENS [TAG]  -> one JSON line on stdout.
// TAG starts the 400-token prompt, so that a run's first turn is new to the server (servers keep
// earlier prompts in their prompt caches); default: the time.
const [base, concArg, tokArg, tagArg] = process.argv.slice(2);
const C = Number(concArg), N = Number(tokArg);

async function stream(prompt, maxTokens) {
  const t0 = performance.now();
  const res = await fetch(base + "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true,
      ignore_eos: true, stream_options: { include_usage: true } }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "", tokens = 0, chunks = 0, first = 0, last = 0;
  const gaps = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
      const ev = JSON.parse(line.slice(6));
      if (ev.usage) tokens = ev.usage.completion_tokens;
      const text = ev.choices && ev.choices.length ? ev.choices[0].text : "";
      if (!text) continue;
      const now = performance.now();
      chunks++;
      if (!first) first = now;
      else gaps.push(now - last);
      last = now;
    }
  }
  return { tokens: tokens || chunks, chunks, gaps, ttft: first - t0, end: performance.now(),
    decodeRate: chunks > 1 && last > first ? ((chunks - 1) * 1000) / (last - first) : 0 };
}

function pct(a, p) {
  if (!a.length) return 0;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

await stream("Warm up", 4);
const t0 = performance.now();
const runs = await Promise.all(Array.from({ length: C }, (_, i) => stream(`Stream ${i}: once upon a time`, N)));
const wall = (Math.max(...runs.map((r) => r.end)) - t0) / 1000;
const tokens = runs.reduce((a, r) => a + r.tokens, 0);
const gaps = runs.flatMap((r) => r.gaps);
// Decode alone: each stream's chunks after its first over the time from its first to its last,
// summed over the streams (the wall figure above also counts the prompts' prefill and the ramp).
const decode = runs.reduce((a, r) => a + r.decodeRate, 0);
// Prefix reuse: a long first turn, then the same text plus a little more.
// About 400 tokens with Llama's vocabulary; a context too small for it skips the measurement.
const tag = tagArg || String(Date.now());
const history = `Run ${tag}. ` + Array.from({ length: 50 }, (_, i) => `line ${i} of the story`).join(". ");
let first = { ttft: NaN }, second = { ttft: NaN };
try {
  first = await stream(history, 1);
  second = await stream(history + ". And then", 1);
} catch (e) {
  console.error("prefix reuse not measured: " + e.message);
}
console.log(JSON.stringify({
  concurrency: C, tokens, wall_s: +wall.toFixed(3), tok_per_s: +(tokens / wall).toFixed(1),
  decode_tok_per_s: +decode.toFixed(1),
  itl_p50_ms: +pct(gaps, 50).toFixed(2), itl_p99_ms: +pct(gaps, 99).toFixed(2),
  itl_p99_per_stream_ms: runs.map((r) => +pct(r.gaps, 99).toFixed(2)),
  tokens_per_chunk: +(tokens / runs.reduce((a, r) => a + r.chunks, 0)).toFixed(2),
  ttft_first_turn_ms: +first.ttft.toFixed(1), ttft_second_turn_ms: +second.ttft.toFixed(1),
}));
