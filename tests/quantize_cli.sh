#!/usr/bin/env bash
# tlm quantize and tlm eval --llama-ppl through the command line: progress per tensor, the same
# file from every input format and from tlm convert --type, clear refusals that leave no file
# behind, and --llama-ppl's chunking (llama-perplexity's: the byte identity of the files and the
# agreement with llama-perplexity itself are in test_quant and bench/quant/accuracy.sh).
. "$(dirname "$0")/lib.sh"
set -eo pipefail
need "$DATA/models"
M=$DATA/models

# Progress: one line per tensor, in llama.cpp's order, with the mix's types.
"$TLM" quantize "$M/stories260K.bin" "$TMP/a.gguf" --type Q4_K_M -z "$M/tok512.bin" 2>"$TMP/log" ||
  die "quantize: $(cat "$TMP/log")"
[ "$(grep -c '^\[ *[0-9]*/  47\]' "$TMP/log")" = 47 ] || die "47 progress lines: $(cat "$TMP/log")"
head -1 "$TMP/log" | grep -q "output_norm.weight *F32" || die "first tensor: $(head -1 "$TMP/log")"
grep -q "token_embd.weight *Q8_0" "$TMP/log" || die "tied embedding falls back to Q8_0"
grep -q "blk.0.attn_q.weight *Q5_0" "$TMP/log" || die "Q4_K falls back to Q5_0 at 64 columns"
grep -q "wrote .*a.gguf (gguf, q4_k_m)" "$TMP/log" || die "summary line"
ok

# tlm info sums the file up as llama.cpp does when it loads one (size, bits per weight, types)
"$TLM" info -m "$TMP/a.gguf" | grep -q "^weights  *0\.[0-9]* MiB, [0-9.]* bits per weight (F32 11, F16 5, Q8_0 3, Q5_0 28)" ||
  die "info's summary: $("$TLM" info -m "$TMP/a.gguf" | grep weights)"
ok

# The same bytes from the GGUF the .bin converts to, and from tlm convert --type.
"$TLM" convert "$M/stories260K.bin" "$TMP/f32.gguf" --to gguf -z "$M/tok512.bin" 2>/dev/null
"$TLM" quantize "$TMP/f32.gguf" "$TMP/b.gguf" --type q4_k_m 2>/dev/null
"$TLM" convert "$M/stories260K.bin" "$TMP/c.gguf" --type q4_k_m -z "$M/tok512.bin" 2>/dev/null
cmp -s "$TMP/a.gguf" "$TMP/b.gguf" || die "quantize from .bin and from .gguf differ"
cmp -s "$TMP/a.gguf" "$TMP/c.gguf" || die "convert --type differs from quantize"
ok

# The 2- and 3-bit mixes: stories260K's 64-column rows fall back to Q4_0, and tlm generates
# from the file.
"$TLM" quantize "$TMP/f32.gguf" "$TMP/e.gguf" --type q3_k_m 2>"$TMP/log" || die "q3_k_m: $(cat "$TMP/log")"
grep -q "blk.0.attn_q.weight *Q4_0" "$TMP/log" || die "Q3_K falls back to Q4_0 at 64 columns"
grep -q "wrote .*e.gguf (gguf, q3_k_m)" "$TMP/log" || die "q3_k_m summary line"
"$TLM" generate -m "$TMP/e.gguf" -n 4 --seed 1 -p "Once" >/dev/null 2>"$TMP/log" ||
  die "generate from q3_k_m: $(cat "$TMP/log")"
ok

# A quantized input is widened and quantized again, with a warning (llama-quantize refuses).
"$TLM" quantize "$TMP/a.gguf" "$TMP/d.gguf" --type q8_0 2>"$TMP/log" || die "requantize: $(cat "$TMP/log")"
grep -q "warning: .*a.gguf holds Q8_0 blocks" "$TMP/log" || die "no requantize warning: $(head -2 "$TMP/log")"
"$TLM" quantize "$TMP/f32.gguf" "$TMP/d.gguf" --type q8_0 2>"$TMP/log"
grep -q warning "$TMP/log" && die "warning for an F32 input"
ok

# Refusals: clear messages, exit status 1, no file left.
expect_fail() { # MESSAGE ARGS...
  local want=$1
  shift
  if "$TLM" "$@" >"$TMP/out" 2>&1; then die "tlm $* succeeded"; fi
  grep -qF -- "$want" "$TMP/out" || die "tlm $*: expected '$want', got: $(cat "$TMP/out")"
  ok
}
expect_fail "unknown --type 'q3_k'" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q3_k
expect_fail "usage: tlm quantize IN OUT --type TYPE" quantize "$TMP/f32.gguf" "$TMP/x.gguf"
expect_fail "--type writes GGUF" convert "$TMP/f32.gguf" "$TMP/x" --to hf --type q8_0
expect_fail "unknown option '--dtype'" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q8_0 --dtype f16
expect_fail "no-such" quantize "$TMP/no-such.gguf" "$TMP/x.gguf" --type q8_0
expect_fail "" quantize "$TMP/f32.gguf" "$TMP/missing-dir/x.gguf" --type q8_0
[ ! -e "$TMP/x.gguf" ] && [ ! -e "$TMP/x" ] || die "a refused command left a file"
ls "$TMP" | grep -q tmp && die "a temporary file was left: $(ls "$TMP")"
ok

# --llama-ppl: floor(n / T) chunks of T tokens (n counts the BOS llama.cpp adds for this
# SentencePiece vocabulary), each predicting T - 1 - T/2 tokens; the model in either file gives
# the same figure.
head -c 8000 "$DATA/text/tinystories_2MiB.txt" >"$TMP/text.txt"
n=$("$TLM" eval -m "$M/stories260K.bin" -z "$M/tok512.bin" --data "$TMP/text.txt" --json |
  json_get 'j["tokens"] + 1')
want=$(((n + 1) / 512 * (512 - 1 - 256)))
a=$("$TLM" eval -m "$M/stories260K.bin" -z "$M/tok512.bin" --data "$TMP/text.txt" --json --llama-ppl)
b=$("$TLM" eval -m "$TMP/f32.gguf" --data "$TMP/text.txt" --json --llama-ppl)
got=$(json_get 'j["tokens"]' <<<"$a")
[ "$got" = "$want" ] || die "--llama-ppl predicted $got tokens, expected $want (n = $n)"
/usr/bin/python3 - "$a" "$b" <<'PY' || die "--llama-ppl: $a vs $b"
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
assert abs(a["perplexity"] - b["perplexity"]) < 1e-3 * a["perplexity"], (a, b)
assert 1 < a["perplexity"] < 50, a
PY
ok
# --cache-type: each window through a session with that cache: an F32 cache gives the training
# pass's figure, an F16 one nearly; a block type needs a head size that is a multiple of 32
c=$("$TLM" eval -m "$TMP/f32.gguf" --data "$TMP/text.txt" --json --llama-ppl --cache-type f32)
d=$("$TLM" eval -m "$TMP/f32.gguf" --data "$TMP/text.txt" --json --llama-ppl -ctk f16 -ctv f16)
/usr/bin/python3 - "$b" "$c" "$d" <<'PY' || die "--cache-type: $b vs $c vs $d"
import json, sys
b, c, d = (json.loads(x) for x in sys.argv[1:])
assert b["tokens"] == c["tokens"] == d["tokens"], (b, c, d)
assert abs(b["perplexity"] - c["perplexity"]) < 1e-5 * b["perplexity"], (b, c)
assert abs(b["perplexity"] - d["perplexity"]) < 1e-3 * b["perplexity"], (b, d)
PY
ok
expect_fail "multiple of 32" eval -m "$TMP/f32.gguf" --data "$TMP/text.txt" --cache-type q8_0
head -c 300 "$TMP/text.txt" >"$TMP/short.txt"
expect_fail "needs at least 2 chunks of 512 tokens" eval -m "$TMP/f32.gguf" --data "$TMP/short.txt" --llama-ppl
# --kl-ref: a quantized model against the model it came from, as llama-perplexity
# --kl-divergence compares them (bench/quant/accuracy.sh compares the figures with its own)
"$TLM" quantize "$TMP/f32.gguf" "$TMP/k8.gguf" --type q8_0 2>/dev/null
"$TLM" quantize "$TMP/f32.gguf" "$TMP/k4.gguf" --type q4_0 2>/dev/null
self=$("$TLM" eval -m "$TMP/f32.gguf" --data "$TMP/text.txt" --llama-ppl --json --kl-ref "$TMP/f32.gguf")
k8=$("$TLM" eval -m "$TMP/k8.gguf" --data "$TMP/text.txt" --llama-ppl --json --kl-ref "$TMP/f32.gguf")
k4=$("$TLM" eval -m "$TMP/k4.gguf" --data "$TMP/text.txt" --llama-ppl --json --kl-ref "$TMP/f32.gguf")
/usr/bin/python3 - "$self" "$k8" "$k4" "$b" <<'PY' || die "--kl-ref: $self / $k8 / $k4 / $b"
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
"$TLM" eval -m "$TMP/k4.gguf" --data "$TMP/text.txt" --kl-ref "$TMP/f32.gguf" | grep -q "same top token" ||
  die "--kl-ref's report"
ok
expect_fail "not the same model" eval -m "$TMP/k4.gguf" --data "$TMP/text.txt" --kl-ref "$M/llama-2-tiny-random.gguf"
expect_fail "no --cache-type" eval -m "$TMP/k4.gguf" --data "$TMP/text.txt" --kl-ref "$TMP/f32.gguf" --cache-type f16

# tlm imatrix: llama-imatrix's statistics of a text (chunks of -c tokens, a BOS first), written
# as its GGUF; tlm quantize --imatrix weighs the rounding by them (test_quant checks the bytes
# against llama-quantize given the same matrix, test_forward the statistics against PyTorch).
head -c 60000 "$DATA/text/tinystories_2MiB.txt" >"$TMP/calib.txt"
"$TLM" imatrix -m "$TMP/f32.gguf" -f "$TMP/calib.txt" -o "$TMP/im.gguf" -c 128 --chunks 6 2>"$TMP/log" ||
  die "imatrix: $(cat "$TMP/log")"
grep -q "^\[6/6\] perplexity so far [0-9.]*$" "$TMP/log" || die "imatrix progress: $(cat "$TMP/log")"
grep -q "wrote .*im.gguf: 35 matrices, 6 chunks of 128 tokens" "$TMP/log" || die "imatrix: $(cat "$TMP/log")"
"$TLM" quantize "$TMP/f32.gguf" "$TMP/qi.gguf" --type q4_0 --imatrix "$TMP/im.gguf" 2>"$TMP/log" ||
  die "quantize --imatrix: $(cat "$TMP/log")"
grep -q "35 importance matrix entries from .*im.gguf computed on 6 chunks" "$TMP/log" ||
  die "quantize --imatrix: $(head -2 "$TMP/log")"
"$TLM" quantize "$TMP/f32.gguf" "$TMP/qp.gguf" --type q4_0 2>/dev/null
cmp -s "$TMP/qi.gguf" "$TMP/qp.gguf" && die "the importance matrix changed nothing"
"$TLM" generate -m "$TMP/qi.gguf" -n 4 --seed 1 -p "Once" >/dev/null 2>"$TMP/log" ||
  die "generate from the imatrix file: $(cat "$TMP/log")"
ok
# merging (llama-imatrix --in-file: sums and token counts add up; both layouts), the legacy
# layout written and read back, --no-ppl
"$TLM" imatrix --in-file "$TMP/im.gguf" --in-file "$TMP/im.gguf" -o "$TMP/im2.gguf" -c 128 2>"$TMP/log" ||
  die "imatrix --in-file: $(cat "$TMP/log")"
grep -q "wrote .*im2.gguf: 35 matrices, 12 chunks of 128 tokens" "$TMP/log" || die "merge: $(cat "$TMP/log")"
"$TLM" imatrix -m "$TMP/f32.gguf" -f "$TMP/calib.txt" -o "$TMP/im.dat" -c 128 --chunks 6 --no-ppl \
  --output-format dat 2>"$TMP/log" || die "imatrix dat: $(cat "$TMP/log")"
grep -q "^\[6/6\]$" "$TMP/log" || die "--no-ppl progress: $(cat "$TMP/log")"
"$TLM" imatrix --in-file "$TMP/im.dat" --in-file "$TMP/im.gguf" -o "$TMP/im3.gguf" -c 128 2>/dev/null
# each quantizes (the merged and legacy matrices read back as llama-quantize reads them)
for f in im2.gguf im.dat im3.gguf; do
  "$TLM" quantize "$TMP/f32.gguf" "$TMP/q_$f.gguf" --type q4_0 --imatrix "$TMP/$f" 2>/dev/null
  "$TLM" info -m "$TMP/q_$f.gguf" >/dev/null || die "quantize with $f"
done
ok
# --show-statistics: llama-imatrix's table (test_quant checks the figures)
"$TLM" imatrix --in-file "$TMP/im.gguf" --show-statistics >"$TMP/stats" || die "--show-statistics"
grep -q "Computing statistics for .*im.gguf (35 tensors)" "$TMP/stats" &&
  grep -q "weighted average statistics per layer (5 layers)" "$TMP/stats" &&
  [ "$(grep -c "	attn_q  " "$TMP/stats")" = 5 ] || die "--show-statistics: $(cat "$TMP/stats")"
ok
expect_fail "--show-statistics reads one matrix" imatrix --show-statistics --in-file "$TMP/im.gguf" --in-file "$TMP/im.dat"
expect_fail "-f TEXT is required (or --in-file" imatrix -m "$TMP/f32.gguf"
expect_fail "--output-format must be gguf or dat" imatrix --in-file "$TMP/im.gguf" -o "$TMP/x.gguf" --output-format bin

# it quantizes with a matrix better than without: perplexity on held-out text, Q2_K
tail -c 30000 "$DATA/text/tinystories_2MiB.txt" >"$TMP/held.txt"
"$TLM" quantize "$TMP/f32.gguf" "$TMP/q2i.gguf" --type q2_k --imatrix "$TMP/im.gguf" 2>/dev/null
"$TLM" quantize "$TMP/f32.gguf" "$TMP/q2p.gguf" --type q2_k 2>/dev/null
pi=$("$TLM" eval -m "$TMP/q2i.gguf" --data "$TMP/held.txt" --json)
pp=$("$TLM" eval -m "$TMP/q2p.gguf" --data "$TMP/held.txt" --json)
/usr/bin/python3 - "$pi" "$pp" <<'PY' || die "q2_k with an imatrix: $pi, without: $pp"
import json, sys
i, p = (json.loads(x) for x in sys.argv[1:])
assert i["perplexity"] < p["perplexity"], (i, p)
PY
ok
expect_fail "--imatrix goes with --type" convert "$TMP/f32.gguf" "$TMP/x.gguf" --to gguf --imatrix "$TMP/im.gguf"
expect_fail "no-such.dat" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --imatrix "$TMP/no-such.dat"
expect_fail "missing imatrix metadata" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --imatrix "$TMP/f32.gguf"
expect_fail "at least two chunks of 512" imatrix -m "$TMP/f32.gguf" -f "$TMP/short.txt"
expect_fail "longer than the model's context" imatrix -m "$TMP/f32.gguf" -f "$TMP/calib.txt" -c 4096
[ ! -e "$TMP/x.gguf" ] || die "a refused command left a file"

# llama-quantize's per-tensor overrides (test_quant checks the bytes against llama.cpp's)
printf 'ATTN_V=q8_0\nblk\\.[0-1]\\.ffn_down=f16\n' >"$TMP/types.txt"
"$TLM" quantize "$TMP/f32.gguf" "$TMP/o.gguf" --type q4_k_m --tensor-type-file "$TMP/types.txt" \
  --output-tensor-type q8_0 --token-embedding-type Q4_0 2>"$TMP/log" || die "overrides: $(cat "$TMP/log")"
grep -q "blk.3.attn_v.weight *Q8_0" "$TMP/log" || die "--tensor-type attn_v: $(cat "$TMP/log")"
grep -q "blk.1.ffn_down.weight *F16" "$TMP/log" || die "--tensor-type ffn_down: $(cat "$TMP/log")"
grep -q "blk.2.attn_q.weight *Q5_0" "$TMP/log" || die "the others keep the mix: $(cat "$TMP/log")"
grep -q "token_embd.weight *Q4_0" "$TMP/log" || die "--token-embedding-type: $(cat "$TMP/log")"
"$TLM" quantize "$TMP/f32.gguf" "$TMP/o.gguf" --type q4_0 --pure --leave-output-tensor 2>"$TMP/log"
grep -q "token_embd.weight *Q4_0" "$TMP/log" || die "--pure: $(cat "$TMP/log")"
ok
# --dry-run: the types and the total, no file
"$TLM" quantize "$TMP/f32.gguf" "$TMP/dry.gguf" --type q4_k_m --dry-run 2>"$TMP/log" || die "dry run: $(cat "$TMP/log")"
[ ! -e "$TMP/dry.gguf" ] || die "--dry-run wrote a file"
grep -q "blk.0.attn_q.weight *Q5_0" "$TMP/log" && grep -q "dry run: .*dry.gguf would hold 0.2[0-9] MiB" "$TMP/log" ||
  die "dry run: $(tail -2 "$TMP/log")"
ok
expect_fail "unknown type 'q9'" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --tensor-type attn_v=q9
expect_fail "wants PATTERN=TYPE" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --tensor-type attn_v
expect_fail "not a regular expression" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --tensor-type 'attn_[v=q8_0'
expect_fail "--output-tensor-type wants a type" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --output-tensor-type i32
expect_fail "unknown option '--pure'" convert "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --pure
[ ! -e "$TMP/x.gguf" ] || die "a refused command left a file"

# --prune-layers and --override-kv: blocks left out and the rest renumbered, metadata set; tlm
# reads the file back (test_quant checks the bytes against llama.cpp's)
"$TLM" quantize "$TMP/f32.gguf" "$TMP/p.gguf" --type q8_0 --prune-layers 1,3 \
  --override-kv general.name=str:pruned --override-kv llama.context_length=int:128 2>"$TMP/log" ||
  die "prune: $(cat "$TMP/log")"
grep -q "blk.2.attn_q.weight" "$TMP/log" && ! grep -q "blk.3.attn_q.weight" "$TMP/log" ||
  die "--prune-layers 1,3 of 5: $(cat "$TMP/log")"
"$TLM" info -m "$TMP/p.gguf" >"$TMP/info"
grep -q "n_layers *3$" "$TMP/info" && grep -q "context_length *128$" "$TMP/info" ||
  die "pruned file: $(cat "$TMP/info")"
"$TLM" generate -m "$TMP/p.gguf" -n 4 --seed 1 -p "Once" >/dev/null 2>"$TMP/log" ||
  die "generate from the pruned file: $(cat "$TMP/log")"
ok
# A GGUF that says it is a mixture of experts (Mixtral's llama.expert_count) is refused by name
"$TLM" quantize "$TMP/f32.gguf" "$TMP/moe.gguf" --type q8_0 --override-kv llama.expert_count=int:8 \
  2>"$TMP/log" || die "expert_count: $(cat "$TMP/log")"
! "$TLM" info -m "$TMP/moe.gguf" >/dev/null 2>"$TMP/log" &&
  grep -q "a mixture of experts (llama.expert_count 8) is not supported" "$TMP/log" ||
  die "expert_count 8 not refused by name: $(cat "$TMP/log")"
ok
# --include-weights / --exclude-weights: the matrix's entries kept or dropped by name
"$TLM" quantize "$TMP/f32.gguf" "$TMP/qs.gguf" --type q4_0 --imatrix "$TMP/im.gguf" --include-weights attn_v \
  --include-weights blk.0. 2>"$TMP/log" || die "--include-weights: $(cat "$TMP/log")"
grep -q "11 importance matrix entries" "$TMP/log" || die "--include-weights: $(head -1 "$TMP/log")"
"$TLM" quantize "$TMP/f32.gguf" "$TMP/qs.gguf" --type q4_0 --imatrix "$TMP/im.gguf" --exclude-weights ffn 2>"$TMP/log" ||
  die "--exclude-weights: $(cat "$TMP/log")"
grep -q "20 importance matrix entries" "$TMP/log" || die "--exclude-weights: $(head -1 "$TMP/log")"
ok
expect_fail "the model has layers 0 to 4, not 5" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --prune-layers 5
expect_fail "every layer pruned" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --prune-layers 0,1,2,3,4
expect_fail "wants layer numbers" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --prune-layers 1,-2
expect_fail "TYPE must be int, float, bool or str" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --override-kv a=u8:1
expect_fail "a bool is true or false" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --override-kv a=bool:1
expect_fail "general.alignment" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --override-kv general.alignment=int:64
expect_fail "select the entries of an --imatrix" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --include-weights attn_v
expect_fail "cannot be used together" quantize "$TMP/f32.gguf" "$TMP/x.gguf" --type q4_0 --imatrix "$TMP/im.gguf" \
  --include-weights attn_v --exclude-weights ffn
[ ! -e "$TMP/x.gguf" ] || die "a refused command left a file"
finish
