#!/usr/bin/env bash
# tlm quantize and tlm eval --llama-ppl through the command line: progress per tensor, the same
# file from every input format and from tlm convert --type, clear refusals that leave no file
# behind, and --llama-ppl's chunking (llama-perplexity's: the byte identity of the files and the
# agreement with llama-perplexity itself are in test_quant and bench/quant/accuracy.sh).
set -euo pipefail
TLM=${TLM:-build/tlm}
SRC=${TLM_SOURCE_DIR:-.}
DATA=${TLM_SHARED_DATA:-$SRC/../shared/data}
W=$(mktemp -d "$PWD/quantize_cli.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pass=0
ok() { pass=$((pass + 1)); }
[ -d "$DATA/models" ] || fail "the shared test data is missing: no directory $DATA/models"
M=$DATA/models

# Progress: one line per tensor, in llama.cpp's order, with the mix's types.
"$TLM" quantize "$M/stories260K.bin" "$W/a.gguf" --type Q4_K_M -z "$M/tok512.bin" 2>"$W/log" ||
  fail "quantize: $(cat "$W/log")"
[ "$(grep -c '^\[ *[0-9]*/  47\]' "$W/log")" = 47 ] || fail "47 progress lines: $(cat "$W/log")"
head -1 "$W/log" | grep -q "output_norm.weight *F32" || fail "first tensor: $(head -1 "$W/log")"
grep -q "token_embd.weight *Q8_0" "$W/log" || fail "tied embedding falls back to Q8_0"
grep -q "blk.0.attn_q.weight *Q5_0" "$W/log" || fail "Q4_K falls back to Q5_0 at 64 columns"
grep -q "wrote .*a.gguf (gguf, q4_k_m)" "$W/log" || fail "summary line"
ok

# tlm info sums the file up as llama.cpp does when it loads one (size, bits per weight, types)
"$TLM" info -m "$W/a.gguf" | grep -q "^weights  *0\.[0-9]* MiB, [0-9.]* bits per weight (F32 11, F16 5, Q8_0 3, Q5_0 28)" ||
  fail "info's summary: $("$TLM" info -m "$W/a.gguf" | grep weights)"
ok

# The same bytes from the GGUF the .bin converts to, and from tlm convert --type.
"$TLM" convert "$M/stories260K.bin" "$W/f32.gguf" --to gguf -z "$M/tok512.bin" 2>/dev/null
"$TLM" quantize "$W/f32.gguf" "$W/b.gguf" --type q4_k_m 2>/dev/null
"$TLM" convert "$M/stories260K.bin" "$W/c.gguf" --type q4_k_m -z "$M/tok512.bin" 2>/dev/null
cmp -s "$W/a.gguf" "$W/b.gguf" || fail "quantize from .bin and from .gguf differ"
cmp -s "$W/a.gguf" "$W/c.gguf" || fail "convert --type differs from quantize"
ok

# The 2- and 3-bit mixes: stories260K's 64-column rows fall back to Q4_0, and tlm generates
# from the file.
"$TLM" quantize "$W/f32.gguf" "$W/e.gguf" --type q3_k_m 2>"$W/log" || fail "q3_k_m: $(cat "$W/log")"
grep -q "blk.0.attn_q.weight *Q4_0" "$W/log" || fail "Q3_K falls back to Q4_0 at 64 columns"
grep -q "wrote .*e.gguf (gguf, q3_k_m)" "$W/log" || fail "q3_k_m summary line"
"$TLM" generate -m "$W/e.gguf" -n 4 --seed 1 -p "Once" >/dev/null 2>"$W/log" ||
  fail "generate from q3_k_m: $(cat "$W/log")"
ok

# A quantized input is widened and quantized again, with a warning (llama-quantize refuses).
"$TLM" quantize "$W/a.gguf" "$W/d.gguf" --type q8_0 2>"$W/log" || fail "requantize: $(cat "$W/log")"
grep -q "warning: .*a.gguf holds Q8_0 blocks" "$W/log" || fail "no requantize warning: $(head -2 "$W/log")"
"$TLM" quantize "$W/f32.gguf" "$W/d.gguf" --type q8_0 2>"$W/log"
grep -q warning "$W/log" && fail "warning for an F32 input"
ok

# Refusals: clear messages, exit status 1, no file left.
expect_fail() { # MESSAGE ARGS...
  local want=$1
  shift
  if "$TLM" "$@" >"$W/out" 2>&1; then fail "tlm $* succeeded"; fi
  grep -qF -- "$want" "$W/out" || fail "tlm $*: expected '$want', got: $(cat "$W/out")"
  ok
}
expect_fail "unknown --type 'q3_k'" quantize "$W/f32.gguf" "$W/x.gguf" --type q3_k
expect_fail "usage: tlm quantize IN OUT --type TYPE" quantize "$W/f32.gguf" "$W/x.gguf"
expect_fail "--type writes GGUF" convert "$W/f32.gguf" "$W/x" --to hf --type q8_0
expect_fail "unknown option '--dtype'" quantize "$W/f32.gguf" "$W/x.gguf" --type q8_0 --dtype f16
expect_fail "no-such" quantize "$W/no-such.gguf" "$W/x.gguf" --type q8_0
expect_fail "" quantize "$W/f32.gguf" "$W/missing-dir/x.gguf" --type q8_0
[ ! -e "$W/x.gguf" ] && [ ! -e "$W/x" ] || fail "a refused command left a file"
ls "$W" | grep -q tmp && fail "a temporary file was left: $(ls "$W")"
ok

# --llama-ppl: floor(n / T) chunks of T tokens (n counts the BOS llama.cpp adds for this
# SentencePiece vocabulary), each predicting T - 1 - T/2 tokens; the model in either file gives
# the same figure.
head -c 8000 "$DATA/text/tinystories_2MiB.txt" >"$W/text.txt"
n=$("$TLM" eval -m "$M/stories260K.bin" -z "$M/tok512.bin" --data "$W/text.txt" --json |
  /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['tokens'] + 1)")
want=$(((n + 1) / 512 * (512 - 1 - 256)))
a=$("$TLM" eval -m "$M/stories260K.bin" -z "$M/tok512.bin" --data "$W/text.txt" --json --llama-ppl)
b=$("$TLM" eval -m "$W/f32.gguf" --data "$W/text.txt" --json --llama-ppl)
got=$(/usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])['tokens'])" "$a")
[ "$got" = "$want" ] || fail "--llama-ppl predicted $got tokens, expected $want (n = $n)"
/usr/bin/python3 - "$a" "$b" <<'PY' || fail "--llama-ppl: $a vs $b"
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
assert abs(a["perplexity"] - b["perplexity"]) < 1e-3 * a["perplexity"], (a, b)
assert 1 < a["perplexity"] < 50, a
PY
ok
# --cache-type: each window through a session with that cache: an F32 cache gives the training
# pass's figure, an F16 one nearly; a block type needs a head size that is a multiple of 32
c=$("$TLM" eval -m "$W/f32.gguf" --data "$W/text.txt" --json --llama-ppl --cache-type f32)
d=$("$TLM" eval -m "$W/f32.gguf" --data "$W/text.txt" --json --llama-ppl -ctk f16 -ctv f16)
/usr/bin/python3 - "$b" "$c" "$d" <<'PY' || fail "--cache-type: $b vs $c vs $d"
import json, sys
b, c, d = (json.loads(x) for x in sys.argv[1:])
assert b["tokens"] == c["tokens"] == d["tokens"], (b, c, d)
assert abs(b["perplexity"] - c["perplexity"]) < 1e-5 * b["perplexity"], (b, c)
assert abs(b["perplexity"] - d["perplexity"]) < 1e-3 * b["perplexity"], (b, d)
PY
ok
expect_fail "multiple of 32" eval -m "$W/f32.gguf" --data "$W/text.txt" --cache-type q8_0
head -c 300 "$W/text.txt" >"$W/short.txt"
expect_fail "needs at least 2 chunks of 512 tokens" eval -m "$W/f32.gguf" --data "$W/short.txt" --llama-ppl
# --kl-ref: a quantized model against the model it came from, as llama-perplexity
# --kl-divergence compares them (bench/quant/accuracy.sh compares the figures with its own)
"$TLM" quantize "$W/f32.gguf" "$W/k8.gguf" --type q8_0 2>/dev/null
"$TLM" quantize "$W/f32.gguf" "$W/k4.gguf" --type q4_0 2>/dev/null
self=$("$TLM" eval -m "$W/f32.gguf" --data "$W/text.txt" --llama-ppl --json --kl-ref "$W/f32.gguf")
k8=$("$TLM" eval -m "$W/k8.gguf" --data "$W/text.txt" --llama-ppl --json --kl-ref "$W/f32.gguf")
k4=$("$TLM" eval -m "$W/k4.gguf" --data "$W/text.txt" --llama-ppl --json --kl-ref "$W/f32.gguf")
/usr/bin/python3 - "$self" "$k8" "$k4" "$b" <<'PY' || fail "--kl-ref: $self / $k8 / $k4 / $b"
import json, sys
s, k8, k4, plain = (json.loads(x) for x in sys.argv[1:])
assert s["kld_mean"] == 0 and s["kld_max"] == 0 and s["same_top"] == 1 and s["ppl_ratio"] == 1, s
assert s["tokens"] == plain["tokens"] == k8["tokens"] == k4["tokens"], (s, plain)
assert abs(s["ppl_base"] - plain["perplexity"]) < 1e-4 * plain["perplexity"], (s, plain)
assert 0 < k8["kld_mean"] < k4["kld_mean"], (k8, k4)
assert k8["kld_median"] <= k8["kld_99"] <= k8["kld_99_9"] <= k8["kld_max"], k8
assert 1 > k8["same_top"] > k4["same_top"] > 0.5, (k8, k4)
assert k8["dp_rms"] < k4["dp_rms"], (k8, k4)
PY
"$TLM" eval -m "$W/k4.gguf" --data "$W/text.txt" --kl-ref "$W/f32.gguf" | grep -q "same top token" ||
  fail "--kl-ref's report"
ok
expect_fail "not the same model" eval -m "$W/k4.gguf" --data "$W/text.txt" --kl-ref "$M/llama-2-tiny-random.gguf"
expect_fail "no --cache-type" eval -m "$W/k4.gguf" --data "$W/text.txt" --kl-ref "$W/f32.gguf" --cache-type f16

# tlm imatrix: llama-imatrix's statistics of a text (chunks of -c tokens, a BOS first), written
# as its GGUF; tlm quantize --imatrix weighs the rounding by them (test_quant checks the bytes
# against llama-quantize given the same matrix, test_forward the statistics against PyTorch).
head -c 60000 "$DATA/text/tinystories_2MiB.txt" >"$W/calib.txt"
"$TLM" imatrix -m "$W/f32.gguf" -f "$W/calib.txt" -o "$W/im.gguf" -c 128 --chunks 6 2>"$W/log" ||
  fail "imatrix: $(cat "$W/log")"
grep -q "^\[6/6\] perplexity so far [0-9.]*$" "$W/log" || fail "imatrix progress: $(cat "$W/log")"
grep -q "wrote .*im.gguf: 35 matrices, 6 chunks of 128 tokens" "$W/log" || fail "imatrix: $(cat "$W/log")"
"$TLM" quantize "$W/f32.gguf" "$W/qi.gguf" --type q4_0 --imatrix "$W/im.gguf" 2>"$W/log" ||
  fail "quantize --imatrix: $(cat "$W/log")"
grep -q "35 importance matrix entries from .*im.gguf computed on 6 chunks" "$W/log" ||
  fail "quantize --imatrix: $(head -2 "$W/log")"
"$TLM" quantize "$W/f32.gguf" "$W/qp.gguf" --type q4_0 2>/dev/null
cmp -s "$W/qi.gguf" "$W/qp.gguf" && fail "the importance matrix changed nothing"
"$TLM" generate -m "$W/qi.gguf" -n 4 --seed 1 -p "Once" >/dev/null 2>"$W/log" ||
  fail "generate from the imatrix file: $(cat "$W/log")"
ok
# merging (llama-imatrix --in-file: sums and token counts add up; both layouts), the legacy
# layout written and read back, --no-ppl
"$TLM" imatrix --in-file "$W/im.gguf" --in-file "$W/im.gguf" -o "$W/im2.gguf" -c 128 2>"$W/log" ||
  fail "imatrix --in-file: $(cat "$W/log")"
grep -q "wrote .*im2.gguf: 35 matrices, 12 chunks of 128 tokens" "$W/log" || fail "merge: $(cat "$W/log")"
"$TLM" imatrix -m "$W/f32.gguf" -f "$W/calib.txt" -o "$W/im.dat" -c 128 --chunks 6 --no-ppl \
  --output-format dat 2>"$W/log" || fail "imatrix dat: $(cat "$W/log")"
grep -q "^\[6/6\]$" "$W/log" || fail "--no-ppl progress: $(cat "$W/log")"
"$TLM" imatrix --in-file "$W/im.dat" --in-file "$W/im.gguf" -o "$W/im3.gguf" -c 128 2>/dev/null
# each quantizes (the merged and legacy matrices read back as llama-quantize reads them)
for f in im2.gguf im.dat im3.gguf; do
  "$TLM" quantize "$W/f32.gguf" "$W/q_$f.gguf" --type q4_0 --imatrix "$W/$f" 2>/dev/null
  "$TLM" info -m "$W/q_$f.gguf" >/dev/null || fail "quantize with $f"
done
ok
# --show-statistics: llama-imatrix's table (test_quant checks the figures)
"$TLM" imatrix --in-file "$W/im.gguf" --show-statistics >"$W/stats" || fail "--show-statistics"
grep -q "Computing statistics for .*im.gguf (35 tensors)" "$W/stats" &&
  grep -q "weighted average statistics per layer (5 layers)" "$W/stats" &&
  [ "$(grep -c "	attn_q  " "$W/stats")" = 5 ] || fail "--show-statistics: $(cat "$W/stats")"
ok
expect_fail "--show-statistics reads one matrix" imatrix --show-statistics --in-file "$W/im.gguf" --in-file "$W/im.dat"
expect_fail "-f TEXT is required (or --in-file" imatrix -m "$W/f32.gguf"
expect_fail "--output-format must be gguf or dat" imatrix --in-file "$W/im.gguf" -o "$W/x.gguf" --output-format bin

# it quantizes with a matrix better than without: perplexity on held-out text, Q2_K
tail -c 30000 "$DATA/text/tinystories_2MiB.txt" >"$W/held.txt"
"$TLM" quantize "$W/f32.gguf" "$W/q2i.gguf" --type q2_k --imatrix "$W/im.gguf" 2>/dev/null
"$TLM" quantize "$W/f32.gguf" "$W/q2p.gguf" --type q2_k 2>/dev/null
pi=$("$TLM" eval -m "$W/q2i.gguf" --data "$W/held.txt" --json)
pp=$("$TLM" eval -m "$W/q2p.gguf" --data "$W/held.txt" --json)
/usr/bin/python3 - "$pi" "$pp" <<'PY' || fail "q2_k with an imatrix: $pi, without: $pp"
import json, sys
i, p = (json.loads(x) for x in sys.argv[1:])
assert i["perplexity"] < p["perplexity"], (i, p)
PY
ok
expect_fail "--imatrix goes with --type" convert "$W/f32.gguf" "$W/x.gguf" --to gguf --imatrix "$W/im.gguf"
expect_fail "no-such.dat" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --imatrix "$W/no-such.dat"
expect_fail "missing imatrix metadata" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --imatrix "$W/f32.gguf"
expect_fail "at least two chunks of 512" imatrix -m "$W/f32.gguf" -f "$W/short.txt"
expect_fail "longer than the model's context" imatrix -m "$W/f32.gguf" -f "$W/calib.txt" -c 4096
[ ! -e "$W/x.gguf" ] || fail "a refused command left a file"

# llama-quantize's per-tensor overrides (test_quant checks the bytes against llama.cpp's)
printf 'ATTN_V=q8_0\nblk\\.[0-1]\\.ffn_down=f16\n' >"$W/types.txt"
"$TLM" quantize "$W/f32.gguf" "$W/o.gguf" --type q4_k_m --tensor-type-file "$W/types.txt" \
  --output-tensor-type q8_0 --token-embedding-type Q4_0 2>"$W/log" || fail "overrides: $(cat "$W/log")"
grep -q "blk.3.attn_v.weight *Q8_0" "$W/log" || fail "--tensor-type attn_v: $(cat "$W/log")"
grep -q "blk.1.ffn_down.weight *F16" "$W/log" || fail "--tensor-type ffn_down: $(cat "$W/log")"
grep -q "blk.2.attn_q.weight *Q5_0" "$W/log" || fail "the others keep the mix: $(cat "$W/log")"
grep -q "token_embd.weight *Q4_0" "$W/log" || fail "--token-embedding-type: $(cat "$W/log")"
"$TLM" quantize "$W/f32.gguf" "$W/o.gguf" --type q4_0 --pure --leave-output-tensor 2>"$W/log"
grep -q "token_embd.weight *Q4_0" "$W/log" || fail "--pure: $(cat "$W/log")"
ok
# --dry-run: the types and the total, no file
"$TLM" quantize "$W/f32.gguf" "$W/dry.gguf" --type q4_k_m --dry-run 2>"$W/log" || fail "dry run: $(cat "$W/log")"
[ ! -e "$W/dry.gguf" ] || fail "--dry-run wrote a file"
grep -q "blk.0.attn_q.weight *Q5_0" "$W/log" && grep -q "dry run: .*dry.gguf would hold 0.2[0-9] MiB" "$W/log" ||
  fail "dry run: $(tail -2 "$W/log")"
ok
expect_fail "unknown type 'q9'" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --tensor-type attn_v=q9
expect_fail "wants PATTERN=TYPE" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --tensor-type attn_v
expect_fail "not a regular expression" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --tensor-type 'attn_[v=q8_0'
expect_fail "--output-tensor-type wants a type" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --output-tensor-type i32
expect_fail "unknown option '--pure'" convert "$W/f32.gguf" "$W/x.gguf" --type q4_0 --pure
[ ! -e "$W/x.gguf" ] || fail "a refused command left a file"

# --prune-layers and --override-kv: blocks left out and the rest renumbered, metadata set; tlm
# reads the file back (test_quant checks the bytes against llama.cpp's)
"$TLM" quantize "$W/f32.gguf" "$W/p.gguf" --type q8_0 --prune-layers 1,3 \
  --override-kv general.name=str:pruned --override-kv llama.context_length=int:128 2>"$W/log" ||
  fail "prune: $(cat "$W/log")"
grep -q "blk.2.attn_q.weight" "$W/log" && ! grep -q "blk.3.attn_q.weight" "$W/log" ||
  fail "--prune-layers 1,3 of 5: $(cat "$W/log")"
"$TLM" info -m "$W/p.gguf" >"$W/info"
grep -q "n_layers *3$" "$W/info" && grep -q "context_length *128$" "$W/info" ||
  fail "pruned file: $(cat "$W/info")"
"$TLM" generate -m "$W/p.gguf" -n 4 --seed 1 -p "Once" >/dev/null 2>"$W/log" ||
  fail "generate from the pruned file: $(cat "$W/log")"
ok
# --include-weights / --exclude-weights: the matrix's entries kept or dropped by name
"$TLM" quantize "$W/f32.gguf" "$W/qs.gguf" --type q4_0 --imatrix "$W/im.gguf" --include-weights attn_v \
  --include-weights blk.0. 2>"$W/log" || fail "--include-weights: $(cat "$W/log")"
grep -q "11 importance matrix entries" "$W/log" || fail "--include-weights: $(head -1 "$W/log")"
"$TLM" quantize "$W/f32.gguf" "$W/qs.gguf" --type q4_0 --imatrix "$W/im.gguf" --exclude-weights ffn 2>"$W/log" ||
  fail "--exclude-weights: $(cat "$W/log")"
grep -q "20 importance matrix entries" "$W/log" || fail "--exclude-weights: $(head -1 "$W/log")"
ok
expect_fail "the model has layers 0 to 4, not 5" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --prune-layers 5
expect_fail "every layer pruned" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --prune-layers 0,1,2,3,4
expect_fail "wants layer numbers" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --prune-layers 1,-2
expect_fail "TYPE must be int, float, bool or str" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --override-kv a=u8:1
expect_fail "a bool is true or false" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --override-kv a=bool:1
expect_fail "general.alignment" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --override-kv general.alignment=int:64
expect_fail "select the entries of an --imatrix" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --include-weights attn_v
expect_fail "cannot be used together" quantize "$W/f32.gguf" "$W/x.gguf" --type q4_0 --imatrix "$W/im.gguf" \
  --include-weights attn_v --exclude-weights ffn
[ ! -e "$W/x.gguf" ] || fail "a refused command left a file"
echo "quantize_cli: $pass passed"
