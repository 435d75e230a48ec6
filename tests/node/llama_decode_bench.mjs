// Decode speed of llama.cpp (node-llama-cpp's prebuilt CPU library) on a GGUF file: greedy
// tokens after a one-token prompt, timed from the first generated token to the last (so prompt
// processing and model loading are excluded, like tlm generate's "decode steps" figure).
//   node llama_decode_bench.mjs MODEL.gguf N_TOKENS THREADS
// Prints one JSON line: {"tokens": N-1 decode steps, "seconds": s, "tok_per_s": r}.
import {getLlama} from "node-llama-cpp";

const [modelPath, nArg, tArg] = process.argv.slice(2);
const n = Number(nArg), threads = Number(tArg);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath, useMmap: true});
const context = await model.createContext({contextSize: n + 16, threads, batchSize: 32});
const seq = context.getSequence();
let count = 0, t0 = 0;
for await (const t of seq.evaluate([1], {temperature: 0})) {
    if (count === 0) t0 = performance.now();
    if (++count >= n) break;
}
const s = (performance.now() - t0) / 1000;
console.log(JSON.stringify({tokens: count - 1, seconds: s, tok_per_s: (count - 1) / s}));
await context.dispose();
await model.dispose();
process.exit(0);
