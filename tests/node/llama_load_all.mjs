// Loads each GGUF file with llama.cpp (node-llama-cpp's prebuilt CPU library) and continues the
// same prompt greedily, in one process (loading the library once is most of the cost).
//   node llama_load_all.mjs "ID ID ..." N MODEL.gguf...
// Prints one JSON line per model: {"model": path, "ids": [N generated ids]} or
// {"model": path, "error": message}.
import {getLlama} from "node-llama-cpp";

const [idsArg, nArg, ...models] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const ids = idsArg.split(/\s+/).filter(Boolean).map(Number);
const n = Number(nArg);
for (const modelPath of models) {
    try {
        const model = await llama.loadModel({modelPath});
        const context = await model.createContext({contextSize: Math.max(64, ids.length + n + 8), threads: 2});
        const seq = context.getSequence();
        const out = [];
        for await (const t of seq.evaluate(ids, {temperature: 0})) {
            out.push(t);
            if (out.length >= n) break;
        }
        console.log(JSON.stringify({model: modelPath, ids: out}));
        await context.dispose();
        await model.dispose();
    } catch (e) {
        console.log(JSON.stringify({model: modelPath, error: String(e)}));
    }
}
process.exit(0);
