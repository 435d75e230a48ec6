#!/usr/bin/env bash
# tlm bench: the table and JSON it prints (one row per test, rates > 0, sample counts), batched
# generation, thread lists, and its refusals. Speed itself is never asserted here (bench/ does).
. "$(dirname "$0")/lib.sh"
M=$DATA/models/stories260K.bin
need "$M"

out=$("$TLM" bench -m "$M" -p 16,32 -n 8 -b 1,3 -t 1,2 -r 2)
expect "bench exits 0" test $? -eq 0
# Per thread count: pp16, pp32, tg8 x batch 1, tg8 x batch 3 -> 8 rows plus 2 header lines.
expect "8 result rows + header ($out)" test "$(printf '%s\n' "$out" | grep -c '^|')" -eq 10
# then, as llama-bench closes with its build, the instruction sets the kernels use
expect "the kernels line" \
  grep -qE '^kernels: (ref|avx2( avx-vnni)?|avx512 vnni( bf16)?( amx-int8)?( amx-bf16)?)$' <<<"$out"
# TLM_ISA caps the kernels' instruction set in a benchmark build only (cmake -DTLM_BENCH_KNOBS=ON,
# src/core/knob.h): the product's build reads no such variable (test_qk_kernels checks the caps)
if grep -qx 'TLM_BENCH_KNOBS:BOOL=ON' "$(dirname "$TLM")/CMakeCache.txt" 2>/dev/null; then
  expect "the kernels line follows TLM_ISA" grep -qx 'kernels: ref' \
    <<<"$(TLM_ISA=ref "$TLM" bench -m "$M" -p 8 -n 0 -r 1)"
  # TLM_ISA=avx2 runs as a CPU without AVX-512 or AVX-VNNI, =avxvnni as one with AVX-VNNI where
  # this CPU has it (cpuid's avx_vnni, as /proc/cpuinfo shows it)
  if grep -qw avx2 /proc/cpuinfo; then
    expect "TLM_ISA=avx2: AVX2 alone" grep -qx 'kernels: avx2' \
      <<<"$(TLM_ISA=avx2 "$TLM" bench -m "$M" -p 8 -n 0 -r 1)"
    want='kernels: avx2'
    grep -qw avx_vnni /proc/cpuinfo && want='kernels: avx2 avx-vnni'
    expect "TLM_ISA=avxvnni: $want" grep -qx "$want" \
      <<<"$(TLM_ISA=avxvnni "$TLM" bench -m "$M" -p 8 -n 0 -r 1)"
  fi
else
  kernels=$(grep '^kernels:' <<<"$out")
  for isa in ref avx2 avxvnni; do
    expect "TLM_ISA=$isa has no effect outside a benchmark build" test "$kernels" = \
      "$(TLM_ISA=$isa "$TLM" bench -m "$M" -p 8 -n 0 -r 1 | grep '^kernels:')"
  done
fi
expect "a pp32 row at 2 threads" grep -qE '\| +2 \| +1 \| +pp32 \| +[0-9.]+ ± [0-9.]+ \|' <<<"$out"
expect "a batched tg8 row" grep -qE '\| +1 \| +3 \| +tg8 \|' <<<"$out"

json=$("$TLM" bench -m "$M" -p 8 -n 4 -b 2 -r 3 -o json)
expect "json exits 0" test $? -eq 0
/usr/bin/python3 - "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert len(r) == 2, r
pp, tg = r
assert pp["n_prompt"] == 8 and pp["n_gen"] == 0 and pp["n_batch_seqs"] == 1, pp
assert tg["n_prompt"] == 0 and tg["n_gen"] == 4 and tg["n_batch_seqs"] == 2, tg
for x in r:
    assert len(x["samples_ts"]) == 3 and all(v > 0 for v in x["samples_ts"]), x
    assert x["cpu_kernels"].split()[0] in ("ref", "avx2", "avx512"), x
    assert abs(x["avg_ts"] - sum(x["samples_ts"]) / 3) <= 1e-6 * x["avg_ts"], x
    assert x["model_n_params"] > 200000 and x["model_size"] >= 4 * x["model_n_params"] - 4096, x
PY
expect "json fields and samples" test $? -eq 0

# --precision bf16: the F32 matrices become BF16 copies (model_size about half); generate and
# eval take the flag too, and refuse other names.
json=$("$TLM" bench -m "$M" -p 8 -n 4 -r 1 -o json --precision bf16)
expect "bf16 json exits 0" test $? -eq 0
/usr/bin/python3 - "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
x = r[0]
assert x["model_size"] < 2.6 * x["model_n_params"], x
PY
expect "bf16: about 2 bytes per parameter" test $? -eq 0
gen=$("$TLM" generate -m "$M" -z "$DATA/models/tok512.bin" -p "Once" -n 8 --temp 0 --precision bf16 2>&1)
expect "generate --precision bf16 ($gen)" grep -q "^Once" <<<"$gen"
expect "generate --precision bogus" grep -q "precision must be auto, fp32 or bf16" \
    <<<"$("$TLM" generate -m "$M" -p x --precision bogus 2>&1)"

# --cache-type: f16 by default, reported with llama-bench's field names; -ctk/-ctv apart
for ct in "" f32 "-ctk bf16" "-ctv f32"; do
    json=$("$TLM" bench -m "$M" -p 0 -n 4 -r 1 -o json ${ct:+$( [[ $ct == -* ]] && echo "$ct" || echo "--cache-type $ct")})
    case "$ct" in "") k=f16 v=f16 ;; f32) k=f32 v=f32 ;; "-ctk bf16") k=bf16 v=f16 ;; *) k=f16 v=f32 ;; esac
    /usr/bin/python3 -c 'import json,sys; x=json.loads(sys.argv[1])[0]; assert (x["type_k"], x["type_v"]) == (sys.argv[2], sys.argv[3]), x' "$json" "$k" "$v"
    expect "bench cache types $k $v" test $? -eq 0
done
expect "md columns for the cache's types" grep -qE '\| +bf16 \| +f16 \| +tg4 ' \
    <<<"$("$TLM" bench -m "$M" -p 0 -n 4 -r 1 -ctk bf16)"

# -d: each test after D cached ids in every sequence, named as llama-bench names it; depth plus
# the longest test must fit the context
out=$("$TLM" bench -m "$M" -p 8 -n 4 -d 0,100 -b 2 -r 1)
expect "depth rows ($out)" test "$(printf '%s\n' "$out" | grep -cE '\| +(pp8|tg4)( @ d100)? +\|')" -eq 4
expect "a tg4 @ d100 row" grep -qE '\| +2 \| +tg4 @ d100 \| +[0-9.]+ ± [0-9.]+ \|' <<<"$out"
json=$("$TLM" bench -m "$M" -p 0 -n 4 -d 64 -r 1 -o json)
/usr/bin/python3 -c 'import json,sys; x=json.loads(sys.argv[1])[0]; assert x["n_depth"]==64 and x["avg_ts"]>0, x' "$json"
expect "json n_depth" test $? -eq 0

err() { "$TLM" bench "$@" 2>&1 >/dev/null; }
expect "depth beyond the context" grep -q "needs 520 positions, the model's context is 512" \
  <<<"$(err -m "$M" -p 8 -n 0 -d 512)"
expect "bad depth" grep -q "bench: -d wants depths" <<<"$(err -m "$M" -d x)"
expect "no model" grep -q "bench: -m MODEL is required" <<<"$(err -p 8)"
expect "bad list" grep -q "bench: -p wants counts" <<<"$(err -m "$M" -p 8,,x)"
expect "zero threads" grep -q "bench: -t wants thread counts" <<<"$(err -m "$M" -t 0)"
expect "Q8_0 cache on head size 8" grep -q "Q8_0 KV cache needs a head size that is a multiple of 32" \
    <<<"$(err -m "$M" -p 0 -n 4 -r 1 --cache-type q8_0)"
expect "beyond the context" grep -q "the model's context is 512" <<<"$(err -m "$M" -p 600)"
expect "missing file" grep -q "bench" <<<"$(err -m /nonexistent.gguf)"
expect "unknown option" grep -q "unknown option '--bogus'" <<<"$(err -m "$M" --bogus)"

finish
