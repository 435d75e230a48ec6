#!/usr/bin/env bash
# Data parallel on one 2-core machine: N=2 processes x 1 thread (mpirun, ZeRO-1) against N=1
# process x 2 threads, training tokens/s for tiny, small and gpt2-124M-like, with the time per step
# spent in communication and the effective bandwidth it implies. Both sides train the same global
# batch on the same random-token llm.c shard (no tokenizing), alternately, REPS rounds.
#   bash bench/mpi/run.sh [STEPS] [REPS]      (make first; ONLY="tiny small gpt2" picks models)
# OPENBLAS_CORETYPE is unset (OpenBLAS's own detection); KEEP_CORETYPE=1 keeps it. OMP_WAIT_POLICY is active for both sides unless set.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TLM=${TLM:-$ROOT/build/tlm}
STEPS=${1:-6}
REPS=${2:-1}
ONLY=${ONLY:-"tiny small gpt2"}
[ -n "${KEEP_CORETYPE:-}" ] || unset OPENBLAS_CORETYPE
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-active}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-$ROOT/bench/out/mpi}
rm -rf "$OUT" && mkdir -p "$OUT"
command -v mpirun >/dev/null || { echo "mpirun not found (scripts/setup.sh installs Open MPI)"; exit 1; }

# name  config  batch  seq-len
models=(
  "tiny $ROOT/bench/mpi/tiny.json 12 64"
  "small $ROOT/bench/generate/small.json 8 256"
  "gpt2 $ROOT/bench/generate/gpt2-124m-like.json 4 256"
)

/usr/bin/python3 - "$OUT/shard.bin" <<'PY'
import sys, numpy as np
toks = np.random.default_rng(0).integers(0, 10000, 1 << 20, dtype=np.uint16)  # below every vocab
head = np.zeros(256, np.int32); head[0], head[1], head[2] = 20240520, 1, len(toks)
open(sys.argv[1], "wb").write(head.tobytes() + toks.tobytes())
PY

# median tokens/s over the steps after the first (which pays for first-touch allocations)
median_tps() {
    sed -n 's/.*"step": \([0-9]*\),.*"tokens_per_s": \([0-9.]*\).*/\1 \2/p' "$1" | awk '$1 > 1 { print $2 }' |
        sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

printf "%s\n" "threads/process: see each row; steps $STEPS; rounds $REPS; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
printf "| model | B x T | N=1 x 2 threads tok/s | N=2 x 1 thread tok/s | ratio | comm/step (N=2) | comm share | effective bandwidth |\n"
printf "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
for spec in "${models[@]}"; do
    read -r name cfg B T <<<"$spec"
    case " $ONLY " in *" $name "*) ;; *) continue ;; esac
    params=$("$TLM" info -c "$cfg" 2>/dev/null | awk '$1 == "total" { print $2 }')
    common=(-c "$cfg" --data "$OUT/shard.bin" --batch "$B" --seq-len "$T" --steps "$STEPS" --warmup 0
            --eval-interval 0 --log-interval 1 --lr 1e-4)
    one=() two=() comm=() wall=()
    for r in $(seq 1 "$REPS"); do
        "$TLM" train "${common[@]}" -t 2 -o "$OUT/$name-1" 2>"$OUT/$name-1.err"
        one+=("$(median_tps "$OUT/$name-1/log.jsonl")")
        mpirun -np 2 --bind-to none "$TLM" train "${common[@]}" -t 1 -o "$OUT/$name-2" 2>"$OUT/$name-2.err"
        two+=("$(median_tps "$OUT/$name-2/log.jsonl")")
        read -r c w < <(sed -n 's/^communication: \([0-9.]*\) s of \([0-9.]*\) s.*/\1 \2/p' "$OUT/$name-2.err")
        comm+=("$c") wall+=("$w")
        rm -rf "$OUT/$name-1" "$OUT/$name-2" # checkpoints of the big model are 1.5 GB
    done
    med() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
    a=$(med "${one[@]}") b=$(med "${two[@]}") c=$(med "${comm[@]}") w=$(med "${wall[@]}")
    # Per step each of the 2 ranks sends and receives half the gradient (reduce-scatter) and half
    # the parameters (all-gather): 2 x (N-1)/N x 4 bytes x params = 4 x params bytes.
    awk -v n="$name" -v B="$B" -v T="$T" -v a="$a" -v b="$b" -v c="$c" -v w="$w" -v s="$STEPS" -v p="$params" 'BEGIN {
        printf "| %s | %d x %d | %.0f | %.0f | %.3f | %.1f ms | %.1f%% | %.2f GB/s |\n",
            n, B, T, a, b, (a > 0 ? b / a : 0), 1000 * c / s, (w > 0 ? 100 * c / w : 0), (c > 0 ? 4 * p * s / c / 1e9 : 0) }'
done
echo "(ratio above 1: two processes are faster; comm share: of rank 0's training wall time, including checkpoint writing)"
