#!/usr/bin/env bash
# The results table of bench/README.md, from one fresh run: runs a chosen set of the benchmarks,
# each against its peer in the same run (training and generation vs PyTorch, quantized decode and
# prefill and serving vs llama.cpp, tokenizing vs tiktoken, bf16 training vs PyTorch autocast),
# reads their JSON output and writes a table (benchmark, tlm, peer, ratio, unit) with the machine,
# the date, tlm's commit, the peers' versions and the settings. The full run rewrites the part of
# bench/README.md between <!-- results:begin --> and <!-- results:end -->.
#
# usage: bash bench/results.sh            full run, about 40 minutes on 2 cores (plus building
#                                         llama.cpp once); run it on an otherwise idle machine
#        QUICK=1 bash bench/results.sh    smoke test of the script: tiny settings, a few minutes;
#                                         the table goes to bench/out/results/results.md only
#        TABLE_ONLY=1 bash bench/results.sh   the table again from the last run's JSON (after a
#                                         change to the table's code; nothing is measured)
# Env:
#   THREADS      threads of every benchmark (default: every core); quantized rows also at 1
#   ONLY         a subset of "train shakespeare generate quant serve tokenizer bf16"
#   README=0|1   rewrite bench/README.md's table (default: 1 for a full run, 0 with QUICK=1)
#   LLAMA_BIN    llama.cpp's binaries (llama-bench, llama-quantize, llama-server); default
#                LLAMA_DIR/build/bin, built there when missing from the source bundle that
#                node-llama-cpp carries (tests/node/node_modules/node-llama-cpp/llama/), CMake
#                Release, native flags (without AMX on CPUs that have it: llama.cpp's AMX kernels
#                died with SIGILL on a virtual Xeon); LLAMA_DIR defaults to ../llama.cpp beside
#                the repository. NO_LLAMA=1 skips the llama.cpp rows; QUICK=1 never builds it.
#   OPENBLAS_CORETYPE  kept when set. Unset, OpenBLAS 0.3.21 falls back to its Prescott (SSE3)
#                kernels on CPUs it does not know; the script then sets SkylakeX (AVX-512) or
#                Haswell (AVX2), as the tlm program does for itself (src/cli/main.c), for the
#                library's benchmarks and PyTorch alike (PyTorch calls the same OpenBLAS).
#                AUTO_CORETYPE=0 leaves OpenBLAS's own choice.
#   OMP_WAIT_POLICY / GOMP_SPINCOUNT  kept when set; otherwise GOMP_SPINCOUNT=3000 for every
#                process, which is what the tlm program sets for itself (docs/environment.md), so
#                that the library benchmarks and the peers wait the same way.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
QUICK=${QUICK:-0}
OUT=$ROOT/bench/out/results
THREADS=${THREADS:-$(nproc)}
ONLY=${ONLY:-train shakespeare generate quant serve tokenizer bf16}
if [ "$QUICK" = 1 ]; then README=${README:-0}; else README=${README:-1}; fi
LLAMA_DIR=${LLAMA_DIR:-$(cd "$ROOT/.." && pwd)/llama.cpp}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
BUNDLE=$ROOT/tests/node/node_modules/node-llama-cpp/llama/gitRelease.bundle
TABLE_ONLY=${TABLE_ONLY:-0}
if [ "$TABLE_ONLY" != 1 ]; then rm -rf "$OUT"; fi
mkdir -p "$OUT"
NOTES=$OUT/notes.txt
[ "$TABLE_ONLY" = 1 ] || : >"$NOTES"
note() { echo "$*" | tee -a "$NOTES" >&2; }
wants() { [[ " $ONLY " == *" $1 "* ]]; }

make -C "$ROOT" >/dev/null || { echo "results.sh: the build failed" >&2; exit 1; }
TLM=$ROOT/build/tlm

# Settings, the same for tlm and its peers.
export KEEP_CORETYPE=1
coretype_note=set
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  unset OPENBLAS_CORETYPE
  coretype_note="OpenBLAS's detection"
  detected=$(OPENBLAS_VERBOSE=2 "$TLM" info -c configs/demo-char.json 2>&1 | sed -n 's/^Core: //p' | head -1)
  if [ "${AUTO_CORETYPE:-1}" != 0 ] && [ "$detected" = Prescott ]; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
    [ -n "${OPENBLAS_CORETYPE:-}" ] && coretype_note="set here: OpenBLAS detected Prescott on this CPU"
  fi
fi
if [ -z "${OMP_WAIT_POLICY:-}" ] && [ -z "${GOMP_SPINCOUNT:-}" ]; then
  export GOMP_SPINCOUNT=3000
  wait_note="GOMP_SPINCOUNT=3000 for every process (what tlm sets for itself; libgomp lets it override the scripts' OMP_WAIT_POLICY=passive)"
else
  wait_note="OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}, GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-unset}"
fi
[ -n "${OMP_WAIT_POLICY:-}" ] && export OMP_WAIT_POLICY
openblas_core=$(OPENBLAS_VERBOSE=2 "$TLM" info -c configs/demo-char.json 2>&1 | sed -n 's/^Core: //p' | head -1)

# llama.cpp: found, built from the bundle, or skipped with a note.
llama_ok() { [ -x "$1/llama-bench" ] && [ -x "$1/llama-quantize" ] && [ -x "$1/llama-server" ]; }
LLAMA=
if [ "${NO_LLAMA:-0}" = 1 ]; then
  note "llama.cpp rows skipped (NO_LLAMA=1)"
elif llama_ok "${LLAMA_BIN:-$LLAMA_DIR/build/bin}"; then
  LLAMA=${LLAMA_BIN:-$LLAMA_DIR/build/bin}
elif [ "$QUICK" = 1 ] || [ -n "${LLAMA_BIN:-}" ]; then
  note "llama.cpp rows skipped: no llama-bench, llama-quantize and llama-server in ${LLAMA_BIN:-$LLAMA_DIR/build/bin}"
elif [ ! -f "$BUNDLE" ]; then
  note "llama.cpp rows skipped: no source bundle at $BUNDLE (bash scripts/setup.sh installs it)"
else
  echo "building llama.cpp in $LLAMA_DIR (once) ..." >&2
  flags=
  grep -qw amx_tile /proc/cpuinfo && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  if { [ -d "$LLAMA_DIR/.git" ] || git clone -q "$BUNDLE" "$LLAMA_DIR"; } &&
     cmake -S "$LLAMA_DIR" -B "$LLAMA_DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
       -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
       -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >"$OUT/llama_build.log" 2>&1 &&
     cmake --build "$LLAMA_DIR/build" -j "$(nproc)" --target llama-bench llama-quantize \
       llama-server >>"$OUT/llama_build.log" 2>&1 &&
     llama_ok "$LLAMA_DIR/build/bin"; then
    LLAMA=$LLAMA_DIR/build/bin
  else
    note "llama.cpp rows skipped: building it failed (bench/out/results/llama_build.log)"
  fi
fi

run_bench() { # NAME COMMAND...: its output in OUT/NAME.log; a failure is noted, not fatal
  local name=$1 t0
  shift
  t0=$(date +%s)
  echo "== $name: $*" >&2
  if "$@" >"$OUT/$name.log" 2>&1; then
    echo "   $name done in $(($(date +%s) - t0)) s" >&2
  else
    note "$name failed (bench/out/results/$name.log)"
  fi
}

if [ "$TABLE_ONLY" = 1 ]; then
  echo "TABLE_ONLY=1: the table from the JSON already in ${OUT#$ROOT/}" >&2
elif [ "$QUICK" = 1 ]; then
  wants train && run_bench train env JSON="$OUT/train.json" THREADS="$THREADS" CONFIGS=tiny \
    bash bench/run_model.sh train 1
  wants shakespeare && run_bench shakespeare env JSON="$OUT/shakespeare.json" THREADS="$THREADS" \
    STEPS=20 WARMUP=5 EVAL_BATCHES=2 PEER=0 OUT="$OUT/shakespeare" bash bench/shakespeare.sh
  wants generate && run_bench generate env JSON="$OUT/generate.json" CONFIGS=small \
    OUT="$OUT/generate" bash bench/generate/run.sh "$THREADS" 1
  if wants quant && [ -n "$LLAMA" ]; then
    run_bench quant env LLAMA_BIN="$LLAMA" MODELS=15M TYPES=Q8_0 bash bench/quant/run.sh 1 32 1
  fi
  wants serve && run_bench serve env REPS=1 LLAMA_SERVER="${LLAMA:-/nonexistent}/llama-server" \
    bash bench/serve/serve_vs_llamaserver.sh "$THREADS" 2 8 "1 2" 15M
  wants tokenizer && run_bench tokenizer env JSON="$OUT/tokenizer.json" OUT="$OUT/tokenizer" \
    bash bench/tokenizer/run.sh 1
  wants bf16 && run_bench bf16 env JSON="$OUT/bf16.json" THREADS="$THREADS" \
    bash bench/bf16/train.sh 1 1 small
else
  wants train && run_bench train env JSON="$OUT/train.json" THREADS="$THREADS" \
    bash bench/run_model.sh all 5
  wants shakespeare && run_bench shakespeare env JSON="$OUT/shakespeare.json" THREADS="$THREADS" \
    OUT="$OUT/shakespeare" bash bench/shakespeare.sh
  wants generate && run_bench generate env JSON="$OUT/generate.json" OUT="$OUT/generate" \
    bash bench/generate/run.sh "$THREADS" 3
  if wants quant && [ -n "$LLAMA" ]; then
    tl=1
    [ "$THREADS" != 1 ] && tl="1 $THREADS"
    run_bench quant env LLAMA_BIN="$LLAMA" MODELS="15M 110M" TYPES="F32 Q8_0 Q4_K_M" \
      bash bench/quant/run.sh "$tl" 32 2
  fi
  wants serve && run_bench serve env REPS=2 LLAMA_SERVER="${LLAMA:-/nonexistent}/llama-server" \
    bash bench/serve/serve_vs_llamaserver.sh "$THREADS" 8 64 "1 8" 110M
  wants tokenizer && run_bench tokenizer env JSON="$OUT/tokenizer.json" OUT="$OUT/tokenizer" \
    bash bench/tokenizer/run.sh 3
  wants bf16 && run_bench bf16 env JSON="$OUT/bf16.json" THREADS="$THREADS" \
    bash bench/bf16/train.sh 3 3 gpt2 small char
fi
# The scripts that write their JSON to fixed places.
[ -f "$OUT/quant.log" ] && cp bench/out/quant/results.json "$OUT/quant.json" 2>/dev/null
[ -f "$OUT/serve.log" ] && cp bench/out/serve_vs_llamaserver.json "$OUT/serve.json" 2>/dev/null

# What ran where.
ver() { "$@" 2>/dev/null | head -1; }
pkg() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null; }
llama_version=
[ -n "$LLAMA" ] && llama_version=$("$LLAMA/llama-server" --version 2>&1 | sed -n 's/^version: //p' | head -1)
# TABLE_ONLY keeps what the measured run recorded.
[ "$TABLE_ONLY" = 1 ] && [ -f "$OUT/meta.json" ] || /usr/bin/python3 - "$OUT/meta.json" <<PY
import json, sys
def read(p):
    try:
        return open(p).read()
    except OSError:
        return ""
cpu = next((l.split(":", 1)[1].strip() for l in read("/proc/cpuinfo").splitlines()
            if l.startswith("model name")), "?")
mem = next((int(l.split()[1]) for l in read("/proc/meminfo").splitlines()
            if l.startswith("MemTotal")), 0)
json.dump({
    "cpu": cpu, "cores": int("$(nproc)"), "memory_gib": round(mem / 2**20, 1),
    "kernels": """$("$TLM" bench -m "$DATA/models/stories260K.gguf" -p 0 -n 1 -r 1 2>/dev/null | sed -n 's/^kernels: //p')""",
    "date": "$(date -u +'%Y-%m-%d %H:%M UTC')",
    "tlm_commit": "$(git -C "$ROOT" describe --always --dirty 2>/dev/null)",
    "gcc": "$(ver gcc -dumpfullversion)",
    "torch": "$(ver /usr/bin/python3 -c 'import torch; print(torch.__version__)')",
    "llama_cpp": """$llama_version""",
    "openblas": "$(pkg libopenblas0-openmp)", "openblas_core": "$openblas_core",
    "onednn": "$(pkg libdnnl2)",
    "tiktoken": "$(ver node -p 'require("./bench/node_modules/tiktoken/package.json").version')",
    "node": "$(ver node --version)",
    "threads": int("$THREADS"), "quick": "$QUICK" == "1",
    "openblas_coretype": "${OPENBLAS_CORETYPE:-unset} ($coretype_note)",
    "wait": "$wait_note",
}, open(sys.argv[1], "w"), indent=1)
PY

rm -f "$OUT/results.md"
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
meta = load("meta")
rows = []  # (benchmark, tlm, peer, ratio, unit)
def row(name, t, p, unit, higher_better=True, digits=1):
    fmt = lambda v: "-" if v is None else f"{v:.{digits}f}"
    r = None
    if t and p:
        r = t / p if higher_better else p / t
    rows.append((name, fmt(t), fmt(p), "-" if r is None else f"{r:.2f}", unit))

for r in load("train") or []:
    what = "forward" if r["mode"] == "forward" else "training step, fp32"
    row(f"{what}: {r['config']} B{r['B']} T{r['T']} (vs PyTorch)", r["tlm_tok_s"],
        r["torch_tok_s"], "tokens/s", digits=0)
s = load("shakespeare")
if s:
    p = s.get("pytorch") or {}
    row(f"Shakespeare-char, {s['precision']}: validation loss (vs PyTorch, same recipe)",
        s["tlm_val_loss"], p.get("val_loss_whole"), "loss", False, 4)
    row("Shakespeare-char: wall time of the whole run (vs PyTorch)", s["tlm_wall_s"],
        p.get("wall_s"), "s", False)
for g in load("generate") or []:
    row(f"decode, batch 1: {g['config']} F32 (vs PyTorch with a KV cache)", g["tlm_decode"],
        g["torch_decode"], "tokens/s")
    row(f"prefill: {g['config']} F32 (vs PyTorch)", g["tlm_prefill"], g["torch_prefill"],
        "tokens/s", digits=0)
for q in load("quant") or []:
    t = f"{q['threads']} thread" + ("s" if q["threads"] > 1 else "")
    row(f"decode tg32: {q['model']} {q['type']}, {t} (vs llama-bench)", q["tlm_decode"],
        q["llamacpp_decode"], "tokens/s")
    row(f"prefill pp128: {q['model']} {q['type']}, {t} (vs llama-bench)", q["tlm_pp128"],
        q["llamacpp_pp128"], "tokens/s", digits=0)
sv = load("serve")
if sv:
    runs = {}
    for r in sv:
        runs.setdefault((r["server"], r["result"]["concurrency"]), []).append(r["result"])
    def med(k, f):
        v = [x[f] for x in runs.get(k, []) if x.get(f) is not None]
        return statistics.median(v) if v else None
    model, par = sv[0]["model"], sv[0]["parallel"]
    for c in sorted({k[1] for k in runs}):
        row(f"serve {model} F32, {c} stream{'s' if c > 1 else ''}, --parallel {par}: aggregate"
            " (vs llama-server)",
            med(("tlm", c), "tok_per_s"), med(("llama-server", c), "tok_per_s"), "tokens/s")
    c = max(k[1] for k in runs)
    row(f"serve, {c} streams: inter-token latency p50 (vs llama-server)",
        med(("tlm", c), "itl_p50_ms"), med(("llama-server", c), "itl_p50_ms"), "ms", False)
    row("serve: time to first token of a chat's second turn (vs llama-server)",
        med(("tlm", 1), "ttft_second_turn_ms"), med(("llama-server", 1), "ttft_second_turn_ms"),
        "ms", False)
tk = load("tokenizer") or []
enc = [r for r in tk if r.get("bench") == "encode"]
mine = next((r for r in enc if r["impl"] == "tlm"), None)
for r in enc:
    if mine and r["impl"] != "tlm":
        same = r.get("same_ids_as_tlm")
        row(f"GPT-2 encoding of 2 MiB of text (vs {r['impl']}{'' if same else ', ids differ'})",
            mine["mb_per_s"], r["mb_per_s"], "MB/s")
for r in tk:
    if r.get("bench") == "train_10k":
        row("BPE training, 2 MiB of text to 10000 tokens (no peer)", r["seconds"], None, "s",
            False, 3)
for b in load("bf16") or []:
    row(f"training step, bf16: {b['config']} B{b['B']} T{b['T']} (vs PyTorch autocast bf16)",
        b["tlm_bf16"], b["torch_bf16"], "tokens/s", digits=0)
    row(f"training step: {b['config']} bf16 against tlm's own fp32", b["tlm_bf16"],
        b["tlm_fp32"], "tokens/s", digits=0)

m = meta
lines = [
    f"Measured by `bash bench/results.sh`{' (QUICK=1: smoke-test settings, not figures)' if m['quick'] else ''} on {m['date']}, tlm `{m['tlm_commit']}`.",
    "",
    f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; tlm's kernels: {m['kernels'] or '?'}.",
    f"- Peers: PyTorch {m['torch'] or '?'}, llama.cpp {m['llama_cpp'] or '(not run)'}, "
    f"tiktoken {m['tiktoken'] or '?'} (node {m['node'] or '?'}); OpenBLAS {m['openblas'] or '?'} "
    f"(core {m['openblas_core'] or '?'}), oneDNN {m['onednn'] or '?'}, gcc {m['gcc']}.",
    f"- Settings: {m['threads']} threads; OPENBLAS_CORETYPE={m['openblas_coretype']}; {m['wait']}.",
    "- Ratio: above 1 means tlm is ahead (faster, or lower loss, time or latency).",
    "",
    "| benchmark | tlm | peer | ratio | unit |",
    "| --- | ---: | ---: | ---: | --- |",
] + [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
notes = open(os.path.join(out, "notes.txt")).read().split("\n")
notes = [n for n in notes if n.strip()]
if notes:
    lines += [""] + [f"- {n}" for n in notes]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
PY
[ -s "$OUT/results.md" ] || { echo "results.sh: writing the table failed" >&2; exit 1; }
cat "$OUT/results.md"

if [ "$README" = 1 ]; then
  /usr/bin/python3 "$ROOT/bench/readme_section.py" results "$OUT/results.md"
  echo "rewrote bench/README.md's results" >&2
fi
