#!/usr/bin/env bash
# Shakespeare-char with nanoGPT's CPU settings: GPT-2 style (layernorm, learned positions, gelu,
# no bias, tied), d 128, 4 layers, 4 heads, ctx 64, batch 12, 2000 steps, lr 1e-3 -> 1e-4 cosine,
# warmup 100, beta2 0.99, wd 0.1, clip 1.0, dropout 0. Reports the final validation loss and the
# wall time of the whole `tlm train` run (tokenization and evaluations included; 20 validation
# batches per evaluation, like nanoGPT's eval_iters=20 on CPU).
# nanoGPT's own run of this recipe reported 1.886 (a 20-batch estimate) in 90.6 s wall. Then,
# unless PEER=0, the same recipe in PyTorch (shakespeare_torch.py, same seed, threads and OpenBLAS
# setting: about two minutes) for the same figures in the same run.
# Env: THREADS (2), SEED (1337), STEPS (2000), WARMUP (100), EVAL_BATCHES (20), PRECISION
# (below), PEER, KEEP_CORETYPE=1 (keep OPENBLAS_CORETYPE; unset otherwise), JSON=FILE (the figures
# as JSON).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
OUT=${OUT:-$ROOT/bench/out/shakespeare}
THREADS=${THREADS:-2}
# PRECISION=auto (tlm's default: bf16 on CPUs with AVX-512 BF16, else fp32), fp32 or bf16: tlm
# train --precision PRECISION, and the PyTorch peer in the precision tlm ran in (bf16: autocast
# to bfloat16).
ASKED=${PRECISION:-auto}
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
rm -rf "$OUT"
mkdir -p "$OUT"
cat >"$OUT/config.json" <<'JSON'
{"vocab_size": 65, "context_length": 64, "d_model": 128, "n_layers": 4, "n_heads": 4,
 "norm": "layernorm", "position": "learned", "ffn": "gelu", "bias": false,
 "tie_embeddings": true, "dropout": 0.0}
JSON
start=$(date +%s.%N)
"$ROOT/$BUILD/tlm" train -c "$OUT/config.json" --data "$DATA/text/tinyshakespeare.txt" --char \
    -o "$OUT/run" --steps "${STEPS:-2000}" --batch 12 --lr 1e-3 --min-lr 1e-4 --warmup "${WARMUP:-100}" --beta2 0.99 \
    --weight-decay 0.1 --clip 1.0 --eval-interval 250 --eval-batches ${EVAL_BATCHES:-20} \
    --init gpt2 --seed "${SEED:-1337}" -t "$THREADS" --precision "$ASKED" 2>"$OUT/train.log"
end=$(date +%s.%N)
# What auto chose, as tlm train reports it.
PRECISION=fp32
grep -q "^precision: bf16" "$OUT/train.log" && PRECISION=bf16
export PRECISION
val=$(grep -o '"val_loss": [0-9.]*' "$OUT/run/log.jsonl" | tail -1 | cut -d' ' -f2)
# The whole validation split (the last 10% of the characters; the file is ASCII), every token
# predicted once: no sampling noise, unlike the in-training estimate over random windows.
n=$(wc -c <"$DATA/text/tinyshakespeare.txt")
tail -c $((n - (n - n / 10) + 1)) "$DATA/text/tinyshakespeare.txt" >"$OUT/val.txt"
full=$("$ROOT/$BUILD/tlm" eval -m "$OUT/run" --data "$OUT/val.txt" --json | sed 's/.*"loss": \([0-9.]*\).*/\1/')
wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
echo "shakespeare-char ($ASKED: $PRECISION, seed ${SEED:-1337}): val loss $full on the whole validation split, $val in-training estimate (target <= 1.89), wall $wall s (target <= 30 s; nanoGPT 90.6 s); threads $THREADS; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
if [ "${PEER:-1}" != 0 ]; then
    p=$(/usr/bin/python3 "$ROOT/bench/shakespeare_torch.py" "$DATA/text/tinyshakespeare.txt" \
        "${SEED:-1337}" "$THREADS")
    echo "pytorch ($PRECISION, same recipe, seed ${SEED:-1337}): val loss $(sed 's/.*"val_loss_whole": \([0-9.]*\).*/\1/' <<<"$p") on the whole validation split, $(sed 's/.*"val_loss_20_batches": \([0-9.]*\).*/\1/' <<<"$p") 20-batch estimate, wall $(sed 's/.*"wall_s": \([0-9.]*\).*/\1/' <<<"$p") s"
    pw=$(sed 's/.*"wall_s": \([0-9.]*\).*/\1/' <<<"$p")
    echo "tlm / pytorch wall: $(awk -v a="$wall" -v b="$pw" 'BEGIN { printf "%.2fx faster", b / a }')"
fi
if [ -n "${JSON:-}" ]; then
    {
        printf '{"precision": "%s", "seed": %s, "threads": %s, "tlm_val_loss": %s, "tlm_val_estimate": %s, "tlm_wall_s": %s' \
            "$PRECISION" "${SEED:-1337}" "$THREADS" "${full:-null}" "${val:-null}" "$wall"
        if [ "${PEER:-1}" != 0 ]; then printf ', "pytorch": %s' "$p"; fi
        echo "}"
    } >"$JSON"
fi
