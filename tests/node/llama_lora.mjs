// Continues a prompt greedily with llama.cpp (node-llama-cpp's prebuilt CPU library) three ways:
// the base model, the base with a LoRA adapter applied unmerged (llama.cpp's --lora), and a model
// with the adapter merged into its weights.
//   node llama_lora.mjs "ID ID ..." N BASE.gguf ADAPTER.gguf MERGED.gguf
// Prints one JSON line per run: {"run": name, "ids": [N generated ids]} or {"run", "error"}.
import {getLlama} from "node-llama-cpp";

const [idsArg, nArg, base, adapter, merged] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const ids = idsArg.split(/\s+/).filter(Boolean).map(Number);
const n = Number(nArg);
const runs = [["base", base, undefined], ["lora", base, {adapters: [{filePath: adapter, scale: 1}]}],
              ["merged", merged, undefined]];
for (const [name, modelPath, lora] of runs) {
    try {
        const model = await llama.loadModel({modelPath});
        const context = await model.createContext({contextSize: Math.max(64, ids.length + n + 8), threads: 2, lora});
        const seq = context.getSequence();
        const out = [];
        for await (const t of seq.evaluate(ids, {temperature: 0})) {
            out.push(t);
            if (out.length >= n) break;
        }
        console.log(JSON.stringify({run: name, ids: out}));
        await context.dispose();
        await model.dispose();
    } catch (e) {
        console.log(JSON.stringify({run: name, error: String(e)}));
    }
}
process.exit(0);
