#!/usr/bin/env bash
# `tlm train --precision bf16`: bit-reproducible for a given thread count, really different from
# fp32 yet learning as well, resumable across precisions (the checkpoint is the same), refused
# with a clear error where the CPU has no avx512_bf16.
. "$(dirname "$0")/lib.sh"

toy_text "$TMP/text.txt"
cat >"$TMP/cfg.json" <<'JSON'
{"context_length": 32, "d_model": 64, "n_layers": 2, "n_heads": 2, "dropout": 0.1}
JSON
common=(-c "$TMP/cfg.json" --data "$TMP/text.txt" --char --batch 8 --lr 3e-3 --warmup 5
        --eval-interval 1000 --eval-batches 4 --log-interval 1 -t 2)
last_loss() { log_col "$1" train_loss | tail -1 | cut -d' ' -f2; }

refuses "unknown precision" "fp32 or bf16 (got 'fp16')" \
    $TLM train "${common[@]}" -o "$TMP/x" --steps 5 --precision fp16

if ! grep -qw avx512_bf16 /proc/cpuinfo; then
    refuses "bf16 without avx512_bf16" "avx512_bf16" \
        $TLM train "${common[@]}" -o "$TMP/x" --steps 5 --precision bf16
    echo "train_bf16: no avx512_bf16 on this CPU: only the refusal was tested"
    finish
    exit
fi

$TLM train "${common[@]}" -o "$TMP/b1" --steps 60 --precision bf16 2>/dev/null; rc=$?
expect "bf16 train exits 0" test $rc -eq 0
$TLM train "${common[@]}" -o "$TMP/b2" --steps 60 --precision bf16 2>/dev/null
expect "bf16 is bit-reproducible at 2 threads" cmp -s "$TMP/b1/model.safetensors" "$TMP/b2/model.safetensors"
$TLM train "${common[@]}" -o "$TMP/f" --steps 60 --precision fp32 2>/dev/null
# The default (auto) is bf16 on a CPU with AVX-512 BF16, as this one.
$TLM train "${common[@]}" -o "$TMP/d" --steps 60 2>"$TMP/d.err"
expect "default is bf16 here" cmp -s "$TMP/b1/model.safetensors" "$TMP/d/model.safetensors"
expect "default says so" grep -q "precision: bf16" "$TMP/d.err"
expect "bf16 differs from fp32" bash -c "! cmp -s '$TMP/b1/model.safetensors' '$TMP/f/model.safetensors'"
lb=$(last_loss "$TMP/b1") lf=$(last_loss "$TMP/f"); echo "  60 steps: bf16 $lb, fp32 $lf"
expect "bf16 learns like fp32 (train loss $lb vs $lf)" \
    holds "a < 2.5 && a - b < 0.05 && b - a < 0.05" a="$lb" b="$lf"
$TLM train "${common[@]}" -o "$TMP/b3" --steps 60 --precision bf16 -t 1 2>/dev/null
$TLM train "${common[@]}" -o "$TMP/b4" --steps 60 --precision bf16 -t 1 2>/dev/null
expect "bf16 is bit-reproducible at 1 thread" cmp -s "$TMP/b3/model.safetensors" "$TMP/b4/model.safetensors"

# Resume across precisions: a run stopped by Ctrl-C continues in the other precision to the end.
for from in fp32 bf16; do
    to=$([ $from = fp32 ] && echo bf16 || echo fp32)
    d=$TMP/r_$from
    $TLM train "${common[@]}" -o "$d" --steps 200 --precision $from 2>"$d.err" &
    pid=$!
    wait_until 10 grep -q "step" "$d.err" 2>/dev/null
    kill -INT $pid
    wait $pid
    $TLM train "${common[@]}" -o "$d" --steps 200 --precision $to --resume 2>/dev/null; rc=$?
    expect "$from checkpoint resumed in $to exits 0" test $rc -eq 0
    expect "$from -> $to log has 200 lines" test "$(wc -l <"$d/log.jsonl")" -eq 200
    l=$(last_loss "$d"); echo "  $from -> $to: loss $l"
    expect "$from -> $to learns (loss $l)" holds "a > 0 && a < 1.5" a="$l"
done

finish
