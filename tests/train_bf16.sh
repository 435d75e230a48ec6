#!/usr/bin/env bash
# `tlm train --precision bf16`: bit-reproducible for a given thread count, really different from
# fp32 yet learning as well, resumable across precisions (the checkpoint is the same), refused
# with a clear error where the CPU has no avx512_bf16.
set -u
TLM=${TLM:-build/tlm}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() { local d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "the cat sat on the mat. a dog ran to the log. $((i % 7))"; done >"$tmp/text.txt"
cat >"$tmp/cfg.json" <<'JSON'
{"context_length": 32, "d_model": 64, "n_layers": 2, "n_heads": 2, "dropout": 0.1}
JSON
common=(-c "$tmp/cfg.json" --data "$tmp/text.txt" --char --batch 8 --lr 3e-3 --warmup 5
        --eval-interval 1000 --eval-batches 4 --log-interval 1 -t 2)
last_loss() { tail -1 "$1/log.jsonl" | sed 's/.*"train_loss": \([0-9.]*\).*/\1/'; }

err=$($TLM train "${common[@]}" -o "$tmp/x" --steps 5 --precision fp16 2>&1 >/dev/null); rc=$?
expect "unknown precision: non-zero exit" test $rc -ne 0
expect "unknown precision named (got: $err)" grep -q "fp32 or bf16 (got 'fp16')" <<<"$err"

if ! grep -qw avx512_bf16 /proc/cpuinfo; then
    err=$($TLM train "${common[@]}" -o "$tmp/x" --steps 5 --precision bf16 2>&1 >/dev/null); rc=$?
    expect "bf16 without avx512_bf16: non-zero exit" test $rc -ne 0
    expect "bf16 without avx512_bf16 says why (got: $err)" grep -q "avx512_bf16" <<<"$err"
    echo "train_bf16: no avx512_bf16 on this CPU: only the refusal was tested"
    echo "train_bf16: $pass passed, $fail failed"
    [ $fail -eq 0 ]
    exit
fi

$TLM train "${common[@]}" -o "$tmp/b1" --steps 60 --precision bf16 2>/dev/null; rc=$?
expect "bf16 train exits 0" test $rc -eq 0
$TLM train "${common[@]}" -o "$tmp/b2" --steps 60 --precision bf16 2>/dev/null
expect "bf16 is bit-reproducible at 2 threads" cmp -s "$tmp/b1/model.safetensors" "$tmp/b2/model.safetensors"
$TLM train "${common[@]}" -o "$tmp/f" --steps 60 --precision fp32 2>/dev/null
# The default (auto) is bf16 on a CPU with AVX-512 BF16, as this one.
$TLM train "${common[@]}" -o "$tmp/d" --steps 60 2>"$tmp/d.err"
expect "default is bf16 here" cmp -s "$tmp/b1/model.safetensors" "$tmp/d/model.safetensors"
expect "default says so" grep -q "precision: bf16" "$tmp/d.err"
expect "bf16 differs from fp32" bash -c "! cmp -s '$tmp/b1/model.safetensors' '$tmp/f/model.safetensors'"
lb=$(last_loss "$tmp/b1") lf=$(last_loss "$tmp/f"); echo "  60 steps: bf16 $lb, fp32 $lf"
expect "bf16 learns like fp32 (train loss $lb vs $lf)" \
    awk -v a="$lb" -v b="$lf" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a < 2.5 && d < 0.05) }'
$TLM train "${common[@]}" -o "$tmp/b3" --steps 60 --precision bf16 -t 1 2>/dev/null
$TLM train "${common[@]}" -o "$tmp/b4" --steps 60 --precision bf16 -t 1 2>/dev/null
expect "bf16 is bit-reproducible at 1 thread" cmp -s "$tmp/b3/model.safetensors" "$tmp/b4/model.safetensors"

# Resume across precisions: a run stopped by Ctrl-C continues in the other precision to the end.
for from in fp32 bf16; do
    to=$([ $from = fp32 ] && echo bf16 || echo fp32)
    d=$tmp/r_$from
    $TLM train "${common[@]}" -o "$d" --steps 200 --precision $from 2>"$d.err" &
    pid=$!
    for _ in $(seq 1 200); do grep -q "step" "$d.err" 2>/dev/null && break; sleep 0.05; done
    kill -INT $pid
    wait $pid
    $TLM train "${common[@]}" -o "$d" --steps 200 --precision $to --resume 2>/dev/null; rc=$?
    expect "$from checkpoint resumed in $to exits 0" test $rc -eq 0
    expect "$from -> $to log has 200 lines" test "$(wc -l <"$d/log.jsonl")" -eq 200
    l=$(last_loss "$d"); echo "  $from -> $to: loss $l"
    expect "$from -> $to learns (loss $l)" awk -v a="$l" 'BEGIN { exit !(a > 0 && a < 1.5) }'
done

echo "train_bf16: $pass passed, $fail failed"
[ $fail -eq 0 ]
