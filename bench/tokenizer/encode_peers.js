// Encode-speed peers for tlm: tiktoken (Rust core compiled to WASM) and js-tiktoken (pure JS),
// both with the `gpt2` encoding, special tokens allowed (as tlm's --allow-special).
// usage: node encode_peers.js FILE REPS [TLM_IDS_FILE]
'use strict';
const fs = require('fs');
const path = require('path');
const nm = path.join(__dirname, '..', 'node_modules');
const { get_encoding } = require(path.join(nm, 'tiktoken'));
const { getEncoding } = require(path.join(nm, 'js-tiktoken'));

const [file, repsArg, tlmIds] = process.argv.slice(2);
const text = fs.readFileSync(file, 'utf8');
const bytes = Buffer.byteLength(text, 'utf8');
const reps = parseInt(repsArg || '3', 10);
const want = tlmIds ? fs.readFileSync(tlmIds, 'utf8').trim().split(' ').map(Number) : null;

function bench(name, encode) {
  let best = Infinity, ids = null;
  encode(text.slice(0, 10000)); // warm-up (JIT, WASM instantiation)
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    ids = encode(text);
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    if (s < best) best = s;
  }
  let same = null;
  if (want) {
    same = ids.length === want.length;
    for (let i = 0; same && i < ids.length; i++) same = ids[i] === want[i];
  }
  console.log(JSON.stringify({ impl: name, bytes, tokens: ids.length, seconds: +best.toFixed(6),
    mb_per_s: +(bytes / 1e6 / best).toFixed(2), same_ids_as_tlm: same }));
}

const wasm = get_encoding('gpt2');
bench('tiktoken ' + require(path.join(nm, 'tiktoken', 'package.json')).version + ' (wasm)',
      (s) => wasm.encode(s, 'all'));
wasm.free();
const js = getEncoding('gpt2');
bench('js-tiktoken ' + require(path.join(nm, 'js-tiktoken', 'package.json')).version,
      (s) => js.encode(s, 'all'));
