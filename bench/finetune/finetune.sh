#!/usr/bin/env bash
# tlm finetune against its peers, in one run, on an otherwise idle machine:
#   - LoRA on an F32 GGUF, QLoRA on the same model in Q4_K_M, and --full: training tokens/s and
#     peak memory (RSS), tlm's defaults (rank 16, alpha 32, every linear layer of the blocks);
#   - a plain PyTorch LoRA loop (bench/finetune/torch_lora.py: the reference model widened to F32,
#     the same shapes, rank and threads; fp32 and bf16 autocast, the faster counted);
#   - llama.cpp's llama-finetune (full fine-tuning of an F32 GGUF) against tlm finetune --full
#     with the same context and batch (one sequence of T tokens a step), on the same shape with 6
#     layers: llama-finetune aborts on the 12-layer model (GGML_ASSERT(cgraph->n_nodes <
#     cgraph->size); llama.cpp's issues 18482 and 18499 report it broken on small models too).
# The model is llama2.c's stories110M shape (d 768, 12 layers, 12 heads, FFN 2048, vocab 32000)
# with random weights: speed and memory do not depend on their values. Rounds alternate the
# sides; figures are medians. Output: bench/out/finetune/ and, with README=1 (default), the table
# in bench/README.md between <!-- finetune:begin --> and <!-- finetune:end -->.
# Env: ROUNDS (3), STEPS (8), B (8), T (256), THREADS (2), LLAMA_DIR (../llama.cpp), NO_LLAMA=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/bench/out/finetune
W=$OUT/work
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-8} B=${B:-8} T=${T:-256} THREADS=${THREADS:-2}
README=${README:-1}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
LLAMA_DIR=${LLAMA_DIR:-$(cd "$ROOT/.." && pwd)/llama.cpp}
TLM=$ROOT/build/tlm
. "$ROOT/bench/lib.sh"
make -C "$ROOT" >/dev/null
mkdir -p "$W"
rm -f "$OUT"/*.log "$OUT"/*.runs "$OUT"/results.*

# OpenBLAS's kernels for this CPU for every process (tlm sets them for itself; PyTorch's BLAS and
# the peers get the same), as bench/results.sh does.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$(OPENBLAS_VERBOSE=2 "$TLM" info -c "$ROOT/configs/demo-char.json" 2>&1 | sed -n 's/^Core: //p' | head -1)
  if [ "$core" = Prescott ] && grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; fi
fi
export KEEP_CORETYPE=1

# The base: one step of tlm train writes the initialized model; then GGUF F32 and Q4_K_M.
TOK=$DATA/tokenizers/ggml-vocab-llama-spm.gguf
TEXT=$DATA/text/tinystories_2MiB.txt
CFG='{"vocab_size": 32000, "context_length": 1024, "d_model": 768, "n_layers": 12, "n_heads": 12,
 "n_kv_heads": 12, "d_ff": 2048, "norm": "rmsnorm", "ffn": "swiglu", "position": "rope",
 "rope_pairing": "interleaved", "tie_embeddings": false, "bias": false}'
echo "$CFG" >"$W/cfg.json"
if [ ! -f "$W/base-q4km.gguf" ]; then
  echo "making the 110M base ..." >&2
  "$TLM" train -c "$W/cfg.json" --data "$TEXT" -z "$TOK" -o "$W/base" --steps 1 --batch 1 \
    --seq-len 64 --warmup 0 --eval-interval 0 -t "$THREADS" 2>"$OUT/base.log"
  "$TLM" convert "$W/base" "$W/base-f32.gguf" --to gguf -z "$TOK" 2>>"$OUT/base.log"
  "$TLM" quantize "$W/base" "$W/base-q4km.gguf" --type q4_k_m -z "$TOK" 2>>"$OUT/base.log"
fi
if [ ! -f "$W/base6-f32.gguf" ]; then
  sed 's/"n_layers": 12/"n_layers": 6/' "$W/cfg.json" >"$W/cfg6.json"
  "$TLM" train -c "$W/cfg6.json" --data "$TEXT" -z "$TOK" -o "$W/base6" --steps 1 --batch 1 \
    --seq-len 64 --warmup 0 --eval-interval 0 -t "$THREADS" 2>>"$OUT/base.log"
  "$TLM" convert "$W/base6" "$W/base6-f32.gguf" --to gguf -z "$TOK" 2>>"$OUT/base.log"
fi
head -c 400000 "$TEXT" >"$W/text.txt"

# tokens/s of a tlm run: the median over its steps after the first two (log.jsonl)
tlm_rate() { tail -n +3 "$1/log.jsonl" | sed 's/.*"tokens_per_s": \([0-9.]*\).*/\1/' | median; }

# tlm finetune KIND BASE ARGS...: one run; appends "tokens/s peak-MiB" to OUT/KIND.runs
tlm_run() {
  local kind=$1 base=$2 dir=$W/ft_$1
  shift 2
  rm -f "$dir/checkpoint.safetensors" "$dir/log.jsonl"
  /usr/bin/time -f "%M" -o "$W/rss" "$TLM" finetune -m "$base" --data "$W/text.txt" -o "$dir" \
    --steps "$STEPS" --warmup 1 --log-interval 1 --eval-interval 0 -t "$THREADS" "$@" \
    >>"$OUT/$kind.log" 2>&1
  echo "$(tlm_rate "$dir") $(($(cat "$W/rss") / 1024))" >>"$OUT/$kind.runs"
}
torch_run() { # PRECISION
  PRECISION=$1 /usr/bin/python3 "$ROOT/bench/finetune/torch_lora.py" "$CFG" "$B" "$T" \
    "$((STEPS + 2))" "$THREADS" 16 2>>"$OUT/torch.log" |
    /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["tokens_per_s"], int(j["peak_rss_mib"]))' \
    >>"$OUT/torch_$1.runs"
}

# llama.cpp's llama-finetune, built from the bundle node-llama-cpp carries when missing.
LF=
if [ "${NO_LLAMA:-0}" != 1 ]; then
  if [ ! -x "$LLAMA_DIR/build/bin/llama-finetune" ] && [ -d "$LLAMA_DIR/.git" ]; then
    echo "building llama-finetune in $LLAMA_DIR ..." >&2
    flags=
    grep -qw amx_tile /proc/cpuinfo && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake -S "$LLAMA_DIR" -B "$LLAMA_DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
      -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >"$OUT/llama_build.log" 2>&1 &&
      cmake --build "$LLAMA_DIR/build" -j "$(nproc)" --target llama-finetune \
        >>"$OUT/llama_build.log" 2>&1 || true
  fi
  [ -x "$LLAMA_DIR/build/bin/llama-finetune" ] && LF=$LLAMA_DIR/build/bin/llama-finetune
fi
# llama-finetune trains one epoch over windows of T at a stride of T/2 (5% held out); its progress
# line gives the epoch's training time, t=HH:MM:SS, and the windows done.
head -c 10000 "$TEXT" >"$W/lf_text.txt"
lf_run() {
  "$LF" -m "$W/base6-f32.gguf" -f "$W/lf_text.txt" -c "$T" -b "$T" -ub "$T" -t "$THREADS" \
    -ngl 0 --epochs 1 -o "$W/lf_out.gguf" >"$W/lf.out" 2>&1 || return 1
  tr '\r' '\n' <"$W/lf.out" | grep -a 'train: \[' | tail -1 |
    sed 's/.*data=0*\([0-9]*\)\/.*t=\([0-9]*\):\([0-9]*\):\([0-9]*\).*/\1 \2 \3 \4/' |
    awk -v T="$T" '{s = $2 * 3600 + $3 * 60 + $4; print (s > 0 ? $1 * T / s : 0)}' >>"$OUT/llama_finetune.runs"
  cat "$W/lf.out" >>"$OUT/llama_finetune.log"
  rm -f "$W/lf_out.gguf"
}

for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS ..." >&2
  tlm_run lora "$W/base-f32.gguf" --batch "$B" --seq-len "$T"
  torch_run fp32
  tlm_run qlora "$W/base-q4km.gguf" --batch "$B" --seq-len "$T"
  torch_run bf16
  tlm_run full "$W/base-f32.gguf" --full --batch "$B" --seq-len "$T"
  if [ -n "$LF" ]; then
    lf_run || echo "llama-finetune failed (bench/out/finetune/llama_finetune.log)" >&2
    tlm_run full1 "$W/base6-f32.gguf" --full --batch 1 --seq-len "$T"
  fi
done

col() { awk -v c="$2" '{print $c}' "$OUT/$1.runs" | median; }
/usr/bin/python3 - "$OUT" "$B" "$T" "$THREADS" "$(git -C "$ROOT" rev-parse --short HEAD)" \
  "$([ -n "$LF" ] && echo 1 || echo 0)" \
  "$(col lora 1) $(col lora 2) $(col qlora 1) $(col qlora 2) $(col full 1) $(col full 2)" \
  "$(col torch_fp32 1) $(col torch_bf16 1) $(col torch_fp32 2) $(col torch_bf16 2)" \
  "$([ -n "$LF" ] && echo "$(col llama_finetune 1) $(col full1 1)" || echo "0 0")" <<'PY'
import json, sys, time
out, B, T, th, rev, have_lf = sys.argv[1:7]
lora, lora_m, qlora, qlora_m, full, full_m = map(float, sys.argv[7].split())
tf, tb, tf_m, tb_m = map(float, sys.argv[8].split())
lf, full1 = map(float, sys.argv[9].split())
torch_best, torch_prec = (tb, "bf16 autocast") if tb > tf else (tf, "fp32")
torch_m = tb_m if tb > tf else tf_m
rows = [
    ("LoRA, F32 base: tokens/s against --full's", lora, full, "tokens/s", ">= 1.3"),
    ("QLoRA, Q4_K_M base: tokens/s against LoRA's on F32", qlora, lora, "tokens/s", ">= 0.9"),
    ("QLoRA, Q4_K_M base: peak RSS against --full's", qlora_m, full_m, "MiB", "<= 0.35"),
    ("LoRA, F32 base: against a PyTorch LoRA loop (%s)" % torch_prec, lora, torch_best, "tokens/s", ">= 2"),
    ("LoRA, F32 base: peak RSS against PyTorch's", lora_m, torch_m, "MiB", ""),
]
if have_lf == "1":
    rows.append(("--full, F32, 6 of the layers, batch 1 x %s: against llama-finetune" % T, full1, lf, "tokens/s", ">= 2"))
lines = ["Measured by `bash bench/finetune/finetune.sh` on %s UTC, tlm `%s`: stories110M-shaped model "
         "(random weights), batch %s x %s tokens, %s threads, LoRA rank 16 alpha 32 on every linear "
         "layer of the blocks; medians of alternated rounds." % (time.strftime("%Y-%m-%d %H:%M", time.gmtime()), rev, B, T, th),
         "", "| comparison | tlm | other | ratio | unit | goal |", "| --- | ---: | ---: | ---: | --- | --- |"]
for name, a, b, unit, goal in rows:
    lines.append("| %s | %.0f | %.0f | %.2f | %s | %s |" % (name, a, b, a / b if b else 0, unit, goal))
lines += ["", "Also: LoRA peak RSS %.0f MiB, QLoRA %.0f MiB, --full %.0f MiB; PyTorch fp32 %.0f and bf16 %.0f tokens/s." %
          (lora_m, qlora_m, full_m, tf, tb)]
open(out + "/results.md", "w").write("\n".join(lines) + "\n")
json.dump(dict(lora=lora, qlora=qlora, full=full, full_batch1=full1, llama_finetune=lf, torch_fp32=tf,
               torch_bf16=tb, rss=dict(lora=lora_m, qlora=qlora_m, full=full_m, torch=torch_m)),
          open(out + "/results.json", "w"), indent=1)
print("\n".join(lines))
PY
if [ "$README" = 1 ]; then
  /usr/bin/python3 "$ROOT/bench/readme_section.py" finetune "$OUT/results.md"
  echo "rewrote bench/README.md's fine-tuning table" >&2
fi
