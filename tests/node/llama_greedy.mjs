// Greedy continuation by llama.cpp (node-llama-cpp's prebuilt CPU library) of a GGUF file.
//   node llama_greedy.mjs MODEL.gguf "ID ID ..." N [--text "PROMPT"]
// Prints one JSON line: {"ids": [N generated ids], "text": their detokenized text,
// "prompt_ids": what llama.cpp's own tokenizer gives for --text (with BOS when the vocab asks)}.
// The prompt is given as ids so that the comparison with tlm is about the model, not the
// tokenizer; --text checks the embedded vocabulary separately.
import {getLlama} from "node-llama-cpp";

const [modelPath, idsArg, nArg, ...rest] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const ids = idsArg.split(/\s+/).filter(Boolean).map(Number);
const n = Number(nArg);
const context = await model.createContext({contextSize: Math.max(64, ids.length + n + 8), threads: 2});
const seq = context.getSequence();
const out = [];
if (n > 0) {
    for await (const t of seq.evaluate(ids, {temperature: 0})) {
        out.push(t);
        if (out.length >= n) break;
    }
}
const result = {ids: out, text: model.detokenize(out)};
const ti = rest.indexOf("--text");
if (ti >= 0) result.prompt_ids = Array.from(model.tokenize(rest[ti + 1], false));
console.log(JSON.stringify(result));
await context.dispose();
await model.dispose();
process.exit(0);
