#!/usr/bin/env bash
# `mpirun -np N tlm train`: the same loss curve whatever the split of the batch over processes and
# micro-steps, bit-identical reruns, a stop on one rank stopping all after a save, resuming with the
# same and a different number of processes, TCP and shared-memory transports, and a killed rank
# ending the job instead of hanging it. Skips (exit 77) only when MPI is not installed.
set -u
TLM=${TLM:-build/tlm}
if ! command -v mpirun >/dev/null 2>&1 || ! ldd "$TLM" 2>/dev/null | grep -q libmpi; then
    echo "SKIP: no mpirun, or $TLM was built without MPI (scripts/setup.sh installs Open MPI)"
    exit 77
fi
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() { local d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }

# Root (CI containers) needs Open MPI's consent; the processes share 2 cores (--oversubscribe).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI keeps its own allocations to the end of the process; the library's are checked elsewhere.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# The ob1 messaging layer honours --mca btl (UCX, when present, would bypass it).
mpi() { local n=$1; shift; timeout 120 mpirun -np "$n" --mca pml ob1 "$@"; }

tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "the cat sat on the mat. a dog ran to the log. $((i % 7))"; done >"$tmp/text.txt"
cat >"$tmp/cfg.json" <<'JSON'
{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2}
JSON
# fp32: the split changes only the order of fp32 sums (bf16, the default on CPUs with it, rounds
# each micro-batch's operands and lets the curves drift further apart).
common=(-c "$tmp/cfg.json" --data "$tmp/text.txt" --char --batch 4 --lr 3e-3 --warmup 2
        --eval-interval 20 --eval-batches 2 --log-interval 1 -t 1 --steps 40 --precision fp32)

# Column `key` of every log line as "step value".
col() { sed -n "s/.*\"step\": \([0-9]*\).*\"$2\": \([-0-9.e]*\).*/\1 \2/p" "$1/log.jsonl"; }
# Largest |difference| of a column between two runs (up to step $4 if given), or "inf" if their
# steps differ.
maxdiff() {
    paste -d' ' <(col "$1" "$3") <(col "$2" "$3") |
        awk -v last="${4:-0}" 'last > 0 && $1 > last { exit }
             NF != 4 || $1 != $3 { print "inf"; exit } { d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d }
             END { if (NR == 0) print "inf"; else if (m == "") print 0; else print m }'
}
# The ranks of a background launch (timeout -> mpirun -> ranks): mpirun's children.
ranks_of() {
    local c
    for c in $(pgrep -P "$1"); do
        if [ "$(cat /proc/$c/comm 2>/dev/null)" = mpirun ]; then pgrep -P "$c"; else ranks_of "$c"; fi
    done
}
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d != "inf" && d <= t) }'; }

# Split independence: 1 process, 1 process x 2 micro-steps, 2 processes (default transport).
$TLM train "${common[@]}" -o "$tmp/n1k1" 2>/dev/null
$TLM train "${common[@]}" -o "$tmp/n1k2" --grad-accum 2 2>/dev/null
mpi 2 $TLM train "${common[@]}" -o "$tmp/n2k1" 2>"$tmp/n2k1.err"; rc=$?
expect "mpirun -np 2 exits 0 (got $rc: $(tail -3 "$tmp/n2k1.err"))" test $rc -eq 0
expect "40 log lines" test "$(wc -l <"$tmp/n2k1/log.jsonl" 2>/dev/null)" = 40
d=$(maxdiff "$tmp/n1k1" "$tmp/n1k2" train_loss)
expect "N=1 K=2 vs N=1 K=1: max |dloss| $d <= 1e-3" within "$d" 1e-3
d=$(maxdiff "$tmp/n1k1" "$tmp/n2k1" train_loss)
expect "N=2 K=1 vs N=1 K=1: max |dloss| $d <= 1e-3" within "$d" 1e-3
d=$(maxdiff "$tmp/n1k1" "$tmp/n2k1" val_loss)
expect "validation split over 2 processes: max |dval| $d <= 1e-3" within "$d" 1e-3
first=$(col "$tmp/n2k1" train_loss | head -1 | cut -d' ' -f2)
last=$(col "$tmp/n2k1" train_loss | tail -1 | cut -d' ' -f2)
expect "the 2-process run learns ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'
expect "ZeRO-1: each process holds half the moments" grep -q "AdamW moments .* ([0-9]* of [0-9]* parameters)" "$tmp/n2k1.err"
n=$(sed -n 's/.*(\([0-9]*\) of \([0-9]*\) parameters).*/\1 \2/p' "$tmp/n2k1.err")
expect "moment share '$n' is half" awk -v a="${n% *}" -v b="${n#* }" 'BEGIN { exit !(a * 2 == b || a * 2 == b - 1) }'
expect "peak memory per process printed" grep -q "peak memory (RSS) per process, MiB: [0-9.]* [0-9.]*$" "$tmp/n2k1.err"
expect "communication time printed" grep -q "^communication: " "$tmp/n2k1.err"
expect "only rank 0 prints progress" test "$(grep -c "step 40/40" "$tmp/n2k1.err")" -eq 1

# Three processes: uneven ranges of the parameters (tensors straddle them), against one process
# with 3 micro-steps.
$TLM train "${common[@]}" --batch 6 --grad-accum 3 -o "$tmp/n1k3" 2>/dev/null
mpi 3 $TLM train "${common[@]}" --batch 6 -o "$tmp/n3k1" 2>"$tmp/n3k1.err"; rc=$?
expect "mpirun -np 3 exits 0 (got $rc: $(tail -3 "$tmp/n3k1.err"))" test $rc -eq 0
d=$(maxdiff "$tmp/n1k3" "$tmp/n3k1" train_loss)
expect "N=3 K=1 vs N=1 K=3: max |dloss| $d <= 1e-3" within "$d" 1e-3

# The same N gives the same bits: over TCP (what several hosts use) and over shared memory.
mpi 2 --mca btl tcp,self $TLM train "${common[@]}" -o "$tmp/tcp" 2>"$tmp/tcp.err"; rc=$?
expect "TCP run exits 0 (got $rc: $(tail -3 "$tmp/tcp.err"))" test $rc -eq 0
expect "TCP rerun is bit for bit" cmp -s "$tmp/n2k1/model.safetensors" "$tmp/tcp/model.safetensors"
mpi 2 --mca btl vader,self $TLM train "${common[@]}" -o "$tmp/shm" 2>"$tmp/shm.err"; rc=$?
expect "shared-memory run exits 0 (got $rc: $(tail -3 "$tmp/shm.err"))" test $rc -eq 0
expect "shared-memory rerun is bit for bit" cmp -s "$tmp/n2k1/model.safetensors" "$tmp/shm/model.safetensors"
expect "checkpoints agree too" cmp -s "$tmp/n2k1/checkpoint.safetensors" "$tmp/shm/checkpoint.safetensors"

# SIGTERM to one rank stops both after a save (exit 130); resuming with 2 processes ends bit for
# bit where the straight run did, and resuming with 1 (elastic) follows the same curve.
# A wider model than the others use, so that 400 steps last over a second even on a quiet machine
# and the signal arrives mid-run (the last -c wins).
cat >"$tmp/cfg_long.json" <<'JSON'
{"context_length": 32, "d_model": 128, "n_layers": 2, "n_heads": 2}
JSON
long=(-c "$tmp/cfg_long.json" --steps 400 --eval-interval 1000)
mpi 2 $TLM train "${common[@]}" "${long[@]}" -o "$tmp/straight" 2>/dev/null
stop_one_rank() { # outdir
    mpi 2 $TLM train "${common[@]}" "${long[@]}" -o "$1" 2>"$1.err" &
    local mp=$! kids
    for _ in $(seq 1 400); do
        [ "$(lines "$1/log.jsonl")" -ge 20 ] && break
        sleep 0.05
    done
    kids=($(ranks_of $mp))
    kill -TERM "${kids[1]:-${kids[0]}}"
    wait $mp
}
stop_one_rank "$tmp/st"; rc=$?
steps=$(wc -l <"$tmp/st/log.jsonl")
expect "SIGTERM on one rank: mpirun exits 130 (got $rc)" test $rc -eq 130
expect "stopped mid-run ($steps steps)" test "$steps" -gt 0 -a "$steps" -lt 400
expect "stop message from rank 0" grep -q "resume with --resume" "$tmp/st.err"
cp -r "$tmp/st" "$tmp/el"
mpi 2 $TLM train "${common[@]}" "${long[@]}" -o "$tmp/st" --resume 2>"$tmp/st2.err"; rc=$?
expect "resume with 2 processes exits 0 (got $rc)" test $rc -eq 0
expect "stop + resume with the same N is bit for bit" cmp -s "$tmp/straight/model.safetensors" "$tmp/st/model.safetensors"
$TLM train "${common[@]}" "${long[@]}" -o "$tmp/el" --resume 2>"$tmp/el.err"; rc=$?
expect "elastic resume with 1 process exits 0 (got $rc: $(tail -2 "$tmp/el.err"))" test $rc -eq 0
# Over the 40 steps after the stop, the horizon the split-independence bound is set for: two float
# summation orders drift apart as training goes on (on this model to ~0.1 by step 400).
d=$(maxdiff "$tmp/straight" "$tmp/el" train_loss $((steps + 40)))
expect "elastic resume (2 -> 1 processes) follows the curve for 40 steps: max |dloss| $d <= 1e-3" within "$d" 1e-3
mpi 3 $TLM train "${common[@]}" "${long[@]}" -o "$tmp/el" --resume 2>"$tmp/el3.err"; rc=$?
expect "a batch 3 processes do not divide is refused (got $rc)" test $rc -ne 0
expect "... saying so" grep -q "does not divide into 3 processes" "$tmp/el3.err"

# Ctrl-C on mpirun itself: Open MPI passes it on as SIGTERM, and the ranks stop after a save.
mpirun -np 2 --mca pml ob1 $TLM train "${common[@]}" "${long[@]}" --steps 100000 -o "$tmp/int" 2>"$tmp/int.err" &
mp=$!
for _ in $(seq 1 400); do [ "$(lines "$tmp/int/log.jsonl")" -ge 5 ] && break; sleep 0.05; done
kill -INT $mp
wait $mp
expect "Ctrl-C on mpirun: the ranks save and say so" grep -q "checkpoint saved (resume with --resume)" "$tmp/int.err"
expect "... the checkpoint exists" test -s "$tmp/int/checkpoint.safetensors"

# A rank killed outright: the job ends (no hang) with the launcher naming the dead rank.
mpi 2 $TLM train "${common[@]}" --steps 100000 --eval-interval 0 -o "$tmp/kill" 2>"$tmp/kill.err" &
mp=$!
for _ in $(seq 1 400); do
    [ "$(lines "$tmp/kill/log.jsonl")" -ge 5 ] && break
    sleep 0.05
done
kids=($(ranks_of $mp))
kill -KILL "${kids[1]:-${kids[0]}}"
wait $mp; rc=$?
expect "a killed rank ends the job with an error (got $rc, 124 = hang)" test $rc -ne 0 -a $rc -ne 124
expect "the launcher names the killed rank" grep -q "exited on signal 9" "$tmp/kill.err"

# A build without MPI, started by mpirun, says so once and fails; run alone it trains as ever.
if [ -x "$(dirname "$TLM")/tlm_nompi" ]; then
    nompi=$(dirname "$TLM")/tlm_nompi
    mpi 2 $nompi train "${common[@]}" -o "$tmp/nompi" 2>"$tmp/nompi.err"; rc=$?
    expect "without MPI under mpirun: fails (got $rc)" test $rc -ne 0
    expect "... saying it was built without MPI, once" test "$(grep -c "built without MPI" "$tmp/nompi.err")" -eq 1
    $nompi train "${common[@]}" --steps 3 -o "$tmp/nompi1" 2>/dev/null; rc=$?
    expect "without MPI, alone: trains (got $rc)" test $rc -eq 0
else
    bad "no tlm_nompi next to $TLM"
fi

echo "mpi: $pass passed, $fail failed"
[ $fail -eq 0 ]
