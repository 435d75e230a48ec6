#!/usr/bin/env bash
# tlm serve against llama.cpp's llama-server on the same GGUF, threads and --parallel: aggregate
# generated tok/s (over the wall time; and decoding alone: each stream's tokens after its first over
# its first-to-last-token time, summed) and inter-token latency (p50/p99) at 1, 4, 8 and 16
# concurrent streams, the aggregate decode rate against one stream's (xN), and the
# time to first token of a ~400-token prompt's second turn (prefix reuse). The model is the
# random-weight llama2.c-shaped 110M (dim 768, hidden 2048, 12 layers, 12 heads, Llama's 32000
# SPM vocabulary), as in bench/formats/decode_vs_llamacpp.sh. OPENBLAS_CORETYPE is unset
# (OpenBLAS's own detection) unless KEEP_CORETYPE=1. Run on an idle machine.
# Usage: bash bench/serve/serve_vs_llamaserver.sh [THREADS=2] [PARALLEL=16] [TOKENS=64]
#        [CONCURRENCY="1 4 8 16"] [MODEL=110M|15M]   (env REPS=3: alternating runs per figure)
# Needs /work/llama.cpp/build/bin/llama-server (LLAMA_SERVER= to point elsewhere).
# TLM_SERVE_ARGS adds options to tlm serve (e.g. "--precision bf16"; defaults otherwise).
# Prints a table and writes bench/out/serve_vs_llamaserver.json.
set -euo pipefail
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TLM=${TLM:-$ROOT/build/tlm}
LLAMA_SERVER=${LLAMA_SERVER:-/work/llama.cpp/build/bin/llama-server}
THREADS=${1:-2}
PARALLEL=${2:-16}
N=${3:-64}
CONC=${4:-1 4 8 16}
MODEL=${5:-110M}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
VOCAB=$DATA/tokenizers/ggml-vocab-llama-spm.gguf
OUT=$ROOT/bench/out
W=$OUT/decode_models
CTX=1024
mkdir -p "$W"
servers="tlm llama-server"
if [ ! -x "$LLAMA_SERVER" ]; then
  echo "no llama-server at $LLAMA_SERVER: measuring tlm alone (no ratios)"
  servers=tlm
fi
case $MODEL in
  15M) spec="288 768 6 6 256" ;;
  110M) spec="768 2048 12 12 1024" ;;
  *) echo "MODEL is 15M or 110M"; exit 1 ;;
esac
read -r dim hidden layers heads seq <<<"$spec"
gguf=$W/$MODEL-spm.gguf  # with the vocabulary (decode_vs_llamacpp.sh makes $MODEL.gguf without one)
if [ ! -f "$gguf" ]; then
  /usr/bin/python3 "$ROOT/bench/formats/random_llama2c.py" "$W/$MODEL.bin" "$dim" "$hidden" \
    "$layers" "$heads" 32000 "$seq"
  "$TLM" convert "$W/$MODEL.bin" "$gguf" --to gguf -z "$VOCAB" 2>/dev/null
  rm -f "$W/$MODEL.bin"
fi
[ "$seq" -lt "$CTX" ] && CTX=$seq

pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; }
trap cleanup EXIT
wait_up() { # URL
  for _ in $(seq 600); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server at $1 did not come up"; exit 1
}
# The host's speed drifts by tens of percent within a minute, so the servers take turns: REPS
# rounds, each starting one server, measuring every concurrency, stopping it, then the other
# (both up at once measured llama-server at half its speed); each figure is the median of its
# REPS runs.
REPS=${REPS:-3}
results=()
for rep in $(seq "$REPS"); do
  for server in $servers; do
    port=$((18500 + RANDOM % 1000))
    if [ "$server" = tlm ]; then
      # shellcheck disable=SC2086 # TLM_SERVE_ARGS is a list of words
      "$TLM" serve -m "$gguf" --port "$port" -t "$THREADS" --parallel "$PARALLEL" --ctx "$CTX" \
        ${TLM_SERVE_ARGS:-} >"$OUT/serve_$server.log" 2>&1 &
    else
      # llama-server's -c is the total over its slots.
      "$LLAMA_SERVER" -m "$gguf" --port "$port" --host 127.0.0.1 -t "$THREADS" -tb "$THREADS" \
        -np "$PARALLEL" -c $((CTX * PARALLEL)) >"$OUT/serve_$server.log" 2>&1 &
    fi
    pid=$!
    wait_up "http://127.0.0.1:$port"
    for c in $CONC; do
      line=$(node "$ROOT/bench/serve/load.mjs" "http://127.0.0.1:$port" "$c" "$N" "$server-$rep-$c")
      echo "$server c=$c rep=$rep $line"
      results+=("{\"server\": \"$server\", \"threads\": $THREADS, \"parallel\": $PARALLEL, \"model\": \"$MODEL\", \"rep\": $rep, \"result\": $line}")
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
  done
done
(IFS=,; echo "[${results[*]}]") >"$OUT/serve_vs_llamaserver.json"
/usr/bin/python3 - "$OUT/serve_vs_llamaserver.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
runs = {}
for r in rows:
    runs.setdefault((r["server"], r["result"]["concurrency"]), []).append(r["result"])
def med(k):  # the run with the median rate (its latencies with it)
    rs = sorted(runs[k], key=lambda x: x["tok_per_s"])
    return rs[(len(rs) - 1) // 2]
by = {k: med(k) for k in runs}
print(f"medians of {max(r.get('rep', 1) for r in rows)} rounds, the servers taking turns")
print(f"{'streams':>7} {'tlm tok/s':>10} {'llama tok/s':>12} {'ratio':>6} {'tlm p50/p99 ms':>15} {'llama p50/p99 ms':>17}"
      f" {'tlm decode':>11} {'llama decode':>13} {'ratio':>6} {'tlm xN':>7} {'llama xN':>9}")
one = {s: by.get((s, 1)) for s in ("tlm", "llama-server")}
def dec(r):  # decode alone: the median over the runs of r's server and concurrency
    if not r:
        return 0
    k = next(k for k, rs in runs.items() if r in rs)
    v = sorted(x.get("decode_tok_per_s", 0) for x in runs[k])
    return v[(len(v) - 1) // 2]
def times(s, r):  # decode tok/s against one stream's
    return f"{dec(r) / dec(one[s]):.2f}x" if one[s] and dec(one[s]) and dec(r) else "-"
for c in sorted({k[1] for k in by}):
    t, l = by.get(("tlm", c)), by.get(("llama-server", c))
    if not t:
        continue
    if not l:
        print(f"{c:>7} {t['tok_per_s']:>10.1f} {'-':>12} {'-':>6} {t['itl_p50_ms']:>7.1f}/{t['itl_p99_ms']:<7.1f}"
              f" {'':>17} {dec(t):>11.1f} {'-':>13} {'-':>6} {times('tlm', t):>7}")
        continue
    dr = f"{dec(t) / dec(l):.2f}" if dec(l) else "-"
    print(f"{c:>7} {t['tok_per_s']:>10.1f} {l['tok_per_s']:>12.1f} {t['tok_per_s'] / l['tok_per_s']:>6.2f} "
          f"{t['itl_p50_ms']:>7.1f}/{t['itl_p99_ms']:<7.1f} {l['itl_p50_ms']:>8.1f}/{l['itl_p99_ms']:<8.1f}"
          f" {dec(t):>11.1f} {dec(l):>13.1f} {dr:>6} {times('tlm', t):>7} {times('llama-server', l):>9}")
for s in ("tlm", "llama-server"):
    ft = sorted(v["ttft_first_turn_ms"] for k, rs in runs.items() if k[0] == s for v in rs if v["ttft_first_turn_ms"])
    st = sorted(v["ttft_second_turn_ms"] for k, rs in runs.items() if k[0] == s for v in rs if v["ttft_second_turn_ms"])
    if ft and st:
        f, t2 = ft[(len(ft) - 1) // 2], st[(len(st) - 1) // 2]
        print(f"{s}: TTFT first turn {f} ms, second turn {t2} ms ({t2 / max(f, 1e-9):.2f}x), medians of {len(ft)}")
PY
