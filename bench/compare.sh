#!/usr/bin/env bash
# "No slower": the working tree against another revision, on the same machine in the same run.
# Builds REV beside the tree (a `git archive` export in bench/out/compare/<sha>/, built with `make`
# and the tree build's CMake options; reused by later runs), builds the tree, then runs each
# benchmark on REV's binaries and on the tree's alternately (REV, tree, REV, tree, ...: REPS
# rounds), each side with the programs built from its own source, and prints the medians.
#
# usage: bench/compare.sh [REV=HEAD] [REPS=3]      (REPS may also come from the environment)
# Benchmarks (ONLY selects a subset; default all):
#   train        bench_model train: tiny, nanoGPT-char, small, gpt2-124M-like (run_model.sh's)
#   forward      bench_model forward: gpt2-124M-like B4 T256
#   decode       bench_gen (bench/generate/run.sh's): decode tok/s, small and gpt2-124M-like
#   prefill      bench_gen: prefill tok/s of the same runs
#   shakespeare  wall time of shakespeare.sh's `tlm train` (no PyTorch peer, no evaluation)
# Env: ONLY="train decode", THREADS (2), ITERS (bench_model timed iterations, 5), GEN_REPS
#   (bench_gen best-of reps; ITERS if set, else 3), STEPS (Shakespeare steps, 2000; warmup 100,
#   or STEPS/10 for short test runs), BUILD (the tree's build directory, build), CMAKE_FLAGS (both
#   builds), REV_CMAKE_FLAGS (REV's build only, last: -DTLM_NATIVE=ON against a tree built with
#   =OFF compares the two builds, bench/native_vs_portable.sh), KEEP_CORETYPE=1 (keep the preset
#   OPENBLAS_CORETYPE), OMP_WAIT_POLICY (passive, tlm's default, unless set), TLM_SHARED_DATA
#   (../shared/data).
# Ratios are tree / REV for rates and REV / tree for wall time: above 1 means the tree is faster.
# "ok" when the ratio is at least 0.97, "SLOWER" otherwise. Writes bench/out/compare.json. Exits 0
# whatever the verdicts; non-zero only when a build or a benchmark run fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REV=${1:-HEAD}
REPS=${2:-${REPS:-3}}
THREADS=${THREADS:-2}
GEN_REPS=${GEN_REPS:-${ITERS:-3}}
ITERS=${ITERS:-5}
STEPS=${STEPS:-2000}
WARMUP=$((STEPS > 100 ? 100 : STEPS / 10)) # the recipe's 100; tlm requires warmup < steps
BUILD=${BUILD:-build}
ONLY=${ONLY:-train forward decode prefill shakespeare}
DATA=${TLM_SHARED_DATA:-$ROOT/../shared/data}
OUT=$ROOT/bench/out/compare
PY=/usr/bin/python3

for w in $ONLY; do
  case $w in train | forward | decode | prefill | shakespeare) ;;
    *) echo "compare.sh: unknown benchmark '$w' in ONLY (train forward decode prefill shakespeare)" >&2
       exit 2 ;;
  esac
done
wants() { [[ " $ONLY " == *" $1 "* ]]; }
if wants shakespeare && [ ! -f "$DATA/text/tinyshakespeare.txt" ]; then
  echo "compare.sh: $DATA/text/tinyshakespeare.txt is missing" >&2
  exit 1
fi

# The same settings as the other benchmarks. bench_model and bench_gen are not the tlm program,
# which picks passive waits itself, so the default is exported for every program alike.
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

SHA=$(git rev-parse --verify --quiet "$REV^{commit}") || { echo "compare.sh: no commit '$REV'" >&2; exit 2; }
SHORT=$(git rev-parse --short=12 "$SHA")
HEAD_SHA=$(git rev-parse --short=12 HEAD)
DIRTY=
if [ -n "$(git status --porcelain)" ]; then DIRTY=", modified"; fi
mkdir -p "$OUT/work"

# --- builds -------------------------------------------------------------------------------------
declare -A SRC BIN
SRC[tree]=$ROOT
BIN[tree]=$BUILD
[[ $BUILD == /* ]] || BIN[tree]=$ROOT/$BUILD
SRC[rev]=$OUT/$SHORT
BIN[rev]=$OUT/$SHORT/build

build() { # side cmake-flags
  local side=$1 log=$OUT/work/build-$1.log
  if ! make -C "${SRC[$side]}" BUILD="${BIN[$side]}" CMAKE_FLAGS="$2" >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "compare.sh: building the $side side failed (log: $log)" >&2
    exit 1
  fi
  # bench_gen is built outside CMake, as bench/generate/run.sh builds it.
  if ! cc -O2 -std=c11 -D_DEFAULT_SOURCE -fopenmp -march=native -I"${SRC[$side]}/include" \
      -I"${SRC[$side]}/src" "${SRC[$side]}/bench/generate/bench_gen.c" "${BIN[$side]}/libtlm.a" \
      -lopenblas -ldnnl -lcjson -lm -o "${BIN[$side]}/bench_gen" >>"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "compare.sh: building bench_gen of the $side side failed (log: $log)" >&2
    exit 1
  fi
}

echo "# building the working tree ($BUILD) ..."
build tree "${CMAKE_FLAGS:-}"
# REV gets the options the tree's build directory was configured with, whatever configured it.
cache() { sed -n "s/^$1:[A-Z]*=//p" "${BIN[tree]}/CMakeCache.txt"; }
REV_FLAGS="-DCMAKE_C_COMPILER=$(cache CMAKE_C_COMPILER) -DTLM_NATIVE=$(cache TLM_NATIVE)"
REV_FLAGS+=" -DTLM_SANITIZE=$(cache TLM_SANITIZE)${CMAKE_FLAGS:+ $CMAKE_FLAGS}"
REV_FLAGS+="${REV_CMAKE_FLAGS:+ $REV_CMAKE_FLAGS}"
if [ ! -d "${SRC[rev]}" ]; then
  echo "# exporting $REV ($SHORT) to ${SRC[rev]#$ROOT/} ..."
  rm -rf "${SRC[rev]}.tmp"
  mkdir -p "${SRC[rev]}.tmp"
  git archive --format=tar "$SHA" | tar -x -C "${SRC[rev]}.tmp"
  mv "${SRC[rev]}.tmp" "${SRC[rev]}"
fi
echo "# building $REV ($SHORT) ..."
build rev "$REV_FLAGS"

# --- benchmarks ---------------------------------------------------------------------------------
# Configs, batch and sequence length of bench/run_model.sh; generation configs and lengths of
# bench/generate/run.sh; the recipe of bench/shakespeare.sh. Both sides get the tree's copies.
TINY='{"vocab_size":65,"context_length":64,"d_model":128,"n_layers":4,"n_heads":4,"norm":"layernorm","position":"learned","ffn":"gelu","tie_embeddings":true}'
CHAR='{"vocab_size":65,"context_length":256,"d_model":384,"n_layers":6,"n_heads":6,"norm":"layernorm","position":"learned","ffn":"gelu","tie_embeddings":true}'
SMALL='{"vocab_size":10000,"context_length":256,"d_model":512,"n_layers":4,"n_heads":16,"d_ff":1344}'
GPT2LIKE='{"vocab_size":50257,"context_length":256,"d_model":768,"n_layers":12,"n_heads":12,"d_ff":2048}'
cat >"$OUT/work/shakespeare.json" <<'JSON'
{"vocab_size": 65, "context_length": 64, "d_model": 128, "n_layers": 4, "n_heads": 4,
 "norm": "layernorm", "position": "learned", "ffn": "gelu", "bias": false,
 "tie_embeddings": true, "dropout": 0.0}
JSON

RAW=$OUT/work/raw.tsv
: >"$RAW"
record() { # name unit side round value
  printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RAW"
  printf '  %-28s %-5s %12.2f %s\n' "$1" "$3" "$5" "$2"
}
fail() { echo "compare.sh: $1 failed on the $2 side${3:+ (log: $3)}" >&2; exit 1; }

bench_model() { # side round name mode B T config
  local side=$1 round=$2 name=$3 mode=$4 r
  r=$("${BIN[$side]}/bench_model" "$mode" "$7" "$5" "$6" "$ITERS" "$THREADS") || fail "$name" "$side"
  record "$name" tok/s "$side" "$round" "$(sed 's/.*"tokens_per_s": \([0-9.]*\).*/\1/' <<<"$r")"
}

bench_gen() { # side round name config plen steps
  local side=$1 round=$2 name=$3 r
  r=$(OMP_NUM_THREADS=$THREADS "${BIN[$side]}/bench_gen" "$ROOT/bench/generate/$4.json" "$THREADS" \
      "$5" "$6" "$GEN_REPS" | grep '^RESULT') || fail "bench_gen $4" "$side"
  if wants decode; then
    record "decode/$name" tok/s "$side" "$round" "$(sed -E 's/.* decode=([0-9.]+).*/\1/' <<<"$r")"
  fi
  if wants prefill; then
    record "prefill/$name" tok/s "$side" "$round" "$(sed -E 's/.* prefill=([0-9.]+).*/\1/' <<<"$r")"
  fi
}

shakespeare() { # side round
  local side=$1 round=$2 dir=$OUT/work/shakespeare-$1 start end
  rm -rf "$dir"
  mkdir -p "$dir"
  start=$(date +%s.%N)
  "${BIN[$side]}/tlm" train -c "$OUT/work/shakespeare.json" --data "$DATA/text/tinyshakespeare.txt" \
    --char -o "$dir/run" --steps "$STEPS" --batch 12 --lr 1e-3 --min-lr 1e-4 --warmup "$WARMUP" \
    --beta2 0.99 --weight-decay 0.1 --clip 1.0 --eval-interval 250 --eval-batches 20 \
    --init gpt2 --seed 1337 -t "$THREADS" 2>"$dir/train.log" || fail shakespeare "$side" "$dir/train.log"
  end=$(date +%s.%N)
  record shakespeare/wall s "$side" "$round" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')"
}

echo "# REV $REV = $SHORT against the working tree (HEAD $HEAD_SHA$DIRTY); rounds: $REPS, REV then tree"
echo "# $(nproc) cores; threads $THREADS; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset};" \
     "OMP_WAIT_POLICY=$OMP_WAIT_POLICY; ITERS=$ITERS GEN_REPS=$GEN_REPS STEPS=$STEPS (warmup $WARMUP);" \
     "REV cmake flags: $REV_FLAGS"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
echo "# load average $LOAD_START"
for round in $(seq 1 "$REPS"); do
  echo "## round $round/$REPS (load $(cut -d' ' -f1-3 /proc/loadavg))"
  if wants train; then
    for side in rev tree; do bench_model $side "$round" train/tiny train 12 64 "$TINY"; done
    for side in rev tree; do bench_model $side "$round" train/nanoGPT-char train 64 256 "$CHAR"; done
    for side in rev tree; do bench_model $side "$round" train/small train 8 256 "$SMALL"; done
    for side in rev tree; do bench_model $side "$round" train/gpt2-124M-like train 4 256 "$GPT2LIKE"; done
  fi
  if wants forward; then
    for side in rev tree; do bench_model $side "$round" forward/gpt2-124M-like forward 4 256 "$GPT2LIKE"; done
  fi
  if wants decode || wants prefill; then
    for side in rev tree; do bench_gen $side "$round" small small 255 128; done
    for side in rev tree; do bench_gen $side "$round" gpt2-124M-like gpt2-124m-like 256 64; done
  fi
  if wants shakespeare; then
    for side in rev tree; do shakespeare $side "$round"; done
  fi
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --- summary ------------------------------------------------------------------------------------
REV_NAME=$REV SHA=$SHA HEAD_SHA=$HEAD_SHA DIRTY=$DIRTY REPS=$REPS THREADS=$THREADS ITERS=$ITERS \
GEN_REPS=$GEN_REPS STEPS=$STEPS CORETYPE=${OPENBLAS_CORETYPE:-} LOAD_START=$LOAD_START \
LOAD_END=$LOAD_END "$PY" - "$RAW" "$ROOT/bench/out/compare.json" <<'PY'
import json, os, statistics, sys

raw, out = sys.argv[1], sys.argv[2]
order, values, units = [], {}, {}
for line in open(raw):
    name, unit, side, _, value = line.rstrip("\n").split("\t")
    if name not in values:
        order.append(name)
        values[name] = {"rev": [], "tree": []}
    values[name][side].append(float(value))
    units[name] = unit

e = os.environ
rows = []
print(f"\n{'benchmark':<28} {'unit':<6} {'REV ' + e['SHA'][:12]:>18} {'tree':>12} {'ratio':>7}  verdict")
for name in order:
    rev, tree = statistics.median(values[name]["rev"]), statistics.median(values[name]["tree"])
    # Above 1 means the tree is faster: rates tree / REV, times REV / tree.
    ratio = rev / tree if units[name] == "s" else tree / rev
    verdict = "ok" if ratio >= 0.97 else "SLOWER"
    print(f"{name:<28} {units[name]:<6} {rev:>18.2f} {tree:>12.2f} {ratio:>6.3f}x  {verdict}")
    rows.append({"benchmark": name, "unit": units[name], "rev": values[name]["rev"],
                 "tree": values[name]["tree"], "rev_median": rev, "tree_median": tree,
                 "ratio": round(ratio, 4), "verdict": verdict})
print(f"# load average {e['LOAD_START']} at the start, {e['LOAD_END']} at the end")
with open(out, "w") as f:
    json.dump({"rev": e["REV_NAME"], "rev_sha": e["SHA"], "tree_head": e["HEAD_SHA"],
               "tree_modified": bool(e["DIRTY"]), "reps": int(e["REPS"]),
               "threads": int(e["THREADS"]), "iters": int(e["ITERS"]),
               "gen_reps": int(e["GEN_REPS"]), "steps": int(e["STEPS"]),
               "openblas_coretype": e["CORETYPE"] or None,
               "omp_wait_policy": e["OMP_WAIT_POLICY"], "nproc": os.cpu_count(),
               "load_start": e["LOAD_START"], "load_end": e["LOAD_END"], "results": rows}, f,
              indent=1)
    f.write("\n")
print(f"# wrote {os.path.relpath(out)}")
PY
