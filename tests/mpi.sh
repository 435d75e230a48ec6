#!/usr/bin/env bash
# `mpirun -np N tlm train`: the same loss curve whatever the split of the batch over processes and
# micro-steps, bit-identical reruns, a stop on one rank stopping all after a save, resuming with the
# same and a different number of processes, TCP and shared-memory transports, and a killed rank
# ending the job instead of hanging it. Skips (exit 77) only when MPI is not installed.
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1 || ! ldd "$TLM" 2>/dev/null | grep -q libmpi; then
    skip "no mpirun, or $TLM was built without MPI (scripts/setup.sh installs Open MPI)"
fi

# Root (CI containers) needs Open MPI's consent; the processes share 2 cores (--oversubscribe).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI keeps its own allocations to the end of the process; the library's are checked elsewhere.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# The ob1 messaging layer honours --mca btl (UCX, when present, would bypass it).
mpi() { local n=$1; shift; timeout 120 mpirun -np "$n" --mca pml ob1 "$@"; }

toy_text "$TMP/text.txt"
cat >"$TMP/cfg.json" <<'JSON'
{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2}
JSON
# fp32: the split changes only the order of fp32 sums (bf16, the default on CPUs with it, rounds
# each micro-batch's operands and lets the curves drift further apart).
common=(-c "$TMP/cfg.json" --data "$TMP/text.txt" --char --batch 4 --lr 3e-3 --warmup 2
        --eval-interval 20 --eval-batches 2 --log-interval 1 -t 1 --steps 40 --precision fp32)

# Largest |difference| of a column between two runs (up to step $4 if given), or "inf" if their
# steps differ.
maxdiff() {
    paste -d' ' <(log_col "$1" "$3") <(log_col "$2" "$3") |
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
has_lines() { [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ]; } # FILE N
within() { holds 'd != "inf" && d <= t' d="$1" t="$2"; }

# Split independence: 1 process, 1 process x 2 micro-steps, 2 processes (default transport).
$TLM train "${common[@]}" -o "$TMP/n1k1" 2>/dev/null
$TLM train "${common[@]}" -o "$TMP/n1k2" --grad-accum 2 2>/dev/null
mpi 2 $TLM train "${common[@]}" -o "$TMP/n2k1" 2>"$TMP/n2k1.err"; rc=$?
expect "mpirun -np 2 exits 0 (got $rc: $(tail -3 "$TMP/n2k1.err"))" test $rc -eq 0
expect "40 log lines" test "$(wc -l <"$TMP/n2k1/log.jsonl" 2>/dev/null)" = 40
d=$(maxdiff "$TMP/n1k1" "$TMP/n1k2" train_loss)
expect "N=1 K=2 vs N=1 K=1: max |dloss| $d <= 1e-3" within "$d" 1e-3
d=$(maxdiff "$TMP/n1k1" "$TMP/n2k1" train_loss)
expect "N=2 K=1 vs N=1 K=1: max |dloss| $d <= 1e-3" within "$d" 1e-3
d=$(maxdiff "$TMP/n1k1" "$TMP/n2k1" val_loss)
expect "validation split over 2 processes: max |dval| $d <= 1e-3" within "$d" 1e-3
first=$(log_col "$TMP/n2k1" train_loss | head -1 | cut -d' ' -f2)
last=$(log_col "$TMP/n2k1" train_loss | tail -1 | cut -d' ' -f2)
expect "the 2-process run learns ($first -> $last)" holds "b < a - 0.5" a="$first" b="$last"
expect "ZeRO-1: each process holds half the moments" grep -q "AdamW moments .* ([0-9]* of [0-9]* parameters)" "$TMP/n2k1.err"
n=$(sed -n 's/.*(\([0-9]*\) of \([0-9]*\) parameters).*/\1 \2/p' "$TMP/n2k1.err")
expect "moment share '$n' is half" holds "a * 2 == b || a * 2 == b - 1" a="${n% *}" b="${n#* }"
expect "peak memory per process printed" grep -q "peak memory (RSS) per process, MiB: [0-9.]* [0-9.]*$" "$TMP/n2k1.err"
expect "communication time printed" grep -q "^communication: " "$TMP/n2k1.err"
expect "only rank 0 prints progress" test "$(grep -c "step 40/40" "$TMP/n2k1.err")" -eq 1

# A mixture of experts over 2 processes: its 3-D expert tensors in the flat gradient, and the
# router losses of each process's rows (not a sum over rows: a small difference in the curve).
cat >"$TMP/moe.json" <<'JSON'
{"context_length": 16, "d_model": 32, "n_layers": 2, "n_heads": 2, "n_experts": 4,
 "n_experts_used": 2, "expert_d_ff": 24, "n_shared_experts": 1, "router_aux_loss_coef": 0.01,
 "router_z_loss_coef": 0.001}
JSON
moe=("${common[@]}")
moe[1]="$TMP/moe.json"
$TLM train "${moe[@]}" --steps 20 -o "$TMP/moe1" 2>/dev/null
mpi 2 $TLM train "${moe[@]}" --steps 20 -o "$TMP/moe2" 2>"$TMP/moe2.err"; rc=$?
expect "mixture over 2 processes exits 0 (got $rc: $(tail -3 "$TMP/moe2.err"))" test $rc -eq 0
d=$(maxdiff "$TMP/moe1" "$TMP/moe2" train_loss)
expect "mixture N=2 vs N=1: max |dloss| $d <= 5e-3" within "$d" 5e-3
expect "router losses logged" grep -q '"router_aux_loss"' "$TMP/moe2/log.jsonl"

# Three processes: uneven ranges of the parameters (tensors straddle them), against one process
# with 3 micro-steps.
$TLM train "${common[@]}" --batch 6 --grad-accum 3 -o "$TMP/n1k3" 2>/dev/null
mpi 3 $TLM train "${common[@]}" --batch 6 -o "$TMP/n3k1" 2>"$TMP/n3k1.err"; rc=$?
expect "mpirun -np 3 exits 0 (got $rc: $(tail -3 "$TMP/n3k1.err"))" test $rc -eq 0
d=$(maxdiff "$TMP/n1k3" "$TMP/n3k1" train_loss)
expect "N=3 K=1 vs N=1 K=3: max |dloss| $d <= 1e-3" within "$d" 1e-3

# The same N gives the same bits: over TCP (what several hosts use) and over shared memory.
mpi 2 --mca btl tcp,self $TLM train "${common[@]}" -o "$TMP/tcp" 2>"$TMP/tcp.err"; rc=$?
expect "TCP run exits 0 (got $rc: $(tail -3 "$TMP/tcp.err"))" test $rc -eq 0
expect "TCP rerun is bit for bit" cmp -s "$TMP/n2k1/model.safetensors" "$TMP/tcp/model.safetensors"
mpi 2 --mca btl vader,self $TLM train "${common[@]}" -o "$TMP/shm" 2>"$TMP/shm.err"; rc=$?
expect "shared-memory run exits 0 (got $rc: $(tail -3 "$TMP/shm.err"))" test $rc -eq 0
expect "shared-memory rerun is bit for bit" cmp -s "$TMP/n2k1/model.safetensors" "$TMP/shm/model.safetensors"
expect "checkpoints agree too" cmp -s "$TMP/n2k1/checkpoint.safetensors" "$TMP/shm/checkpoint.safetensors"

# SIGTERM to one rank stops both after a save (exit 130); resuming with 2 processes ends bit for
# bit where the straight run did, and resuming with 1 (elastic) follows the same curve.
# A wider model than the others use, so that 400 steps last over a second even on a quiet machine
# and the signal arrives mid-run (the last -c wins). The signal waits for step 60: over the first
# few dozen steps of GPT-2's initialization two summation orders part by up to ~3e-3 in 40 steps,
# past the bound below, and from there on by under 1e-4.
cat >"$TMP/cfg_long.json" <<'JSON'
{"context_length": 32, "d_model": 128, "n_layers": 2, "n_heads": 2}
JSON
long=(-c "$TMP/cfg_long.json" --steps 400 --eval-interval 1000)
mpi 2 $TLM train "${common[@]}" "${long[@]}" -o "$TMP/straight" 2>/dev/null
stop_one_rank() { # outdir
    mpi 2 $TLM train "${common[@]}" "${long[@]}" -o "$1" 2>"$1.err" &
    local mp=$! kids
    wait_until 20 has_lines "$1/log.jsonl" 60
    kids=($(ranks_of $mp))
    kill -TERM "${kids[1]:-${kids[0]}}"
    wait $mp
}
stop_one_rank "$TMP/st"; rc=$?
steps=$(wc -l <"$TMP/st/log.jsonl")
expect "SIGTERM on one rank: mpirun exits 130 (got $rc)" test $rc -eq 130
expect "stopped mid-run ($steps steps)" test "$steps" -gt 0 -a "$steps" -lt 400
expect "stop message from rank 0" grep -q "resume with --resume" "$TMP/st.err"
cp -r "$TMP/st" "$TMP/el"
mpi 2 $TLM train "${common[@]}" "${long[@]}" -o "$TMP/st" --resume 2>"$TMP/st2.err"; rc=$?
expect "resume with 2 processes exits 0 (got $rc)" test $rc -eq 0
expect "stop + resume with the same N is bit for bit" cmp -s "$TMP/straight/model.safetensors" "$TMP/st/model.safetensors"
$TLM train "${common[@]}" "${long[@]}" -o "$TMP/el" --resume 2>"$TMP/el.err"; rc=$?
expect "elastic resume with 1 process exits 0 (got $rc: $(tail -2 "$TMP/el.err"))" test $rc -eq 0
# Over the 40 steps after the stop, the horizon the split-independence bound is set for: two float
# summation orders drift apart as training goes on (on this model to ~0.1 by step 400).
d=$(maxdiff "$TMP/straight" "$TMP/el" train_loss $((steps + 40)))
expect "elastic resume (2 -> 1 processes) follows the curve for 40 steps: max |dloss| $d <= 1e-3" within "$d" 1e-3
mpi 3 $TLM train "${common[@]}" "${long[@]}" -o "$TMP/el" --resume 2>"$TMP/el3.err"; rc=$?
expect "a batch 3 processes do not divide is refused (got $rc)" test $rc -ne 0
expect "... saying so" grep -q "does not divide into 3 processes" "$TMP/el3.err"

# Ctrl-C on mpirun itself: Open MPI passes it on as SIGTERM, and the ranks stop after a save.
mpirun -np 2 --mca pml ob1 $TLM train "${common[@]}" "${long[@]}" --steps 100000 -o "$TMP/int" 2>"$TMP/int.err" &
mp=$!
wait_until 20 has_lines "$TMP/int/log.jsonl" 5
kill -INT $mp
wait $mp
expect "Ctrl-C on mpirun: the ranks save and say so" grep -q "checkpoint saved (resume with --resume)" "$TMP/int.err"
expect "... the checkpoint exists" test -s "$TMP/int/checkpoint.safetensors"

# A rank killed outright: the job ends (no hang) with the launcher naming the dead rank.
mpi 2 $TLM train "${common[@]}" --steps 100000 --eval-interval 0 -o "$TMP/kill" 2>"$TMP/kill.err" &
mp=$!
wait_until 20 has_lines "$TMP/kill/log.jsonl" 5
kids=($(ranks_of $mp))
kill -KILL "${kids[1]:-${kids[0]}}"
wait $mp; rc=$?
expect "a killed rank ends the job with an error (got $rc, 124 = hang)" test $rc -ne 0 -a $rc -ne 124
expect "the launcher names the killed rank" grep -q "exited on signal 9" "$TMP/kill.err"

# A build without MPI, started by mpirun, says so once and fails; run alone it trains as ever.
if [ -x "$(dirname "$TLM")/tlm_nompi" ]; then
    nompi=$(dirname "$TLM")/tlm_nompi
    mpi 2 $nompi train "${common[@]}" -o "$TMP/nompi" 2>"$TMP/nompi.err"; rc=$?
    expect "without MPI under mpirun: fails (got $rc)" test $rc -ne 0
    expect "... saying it was built without MPI, once" test "$(grep -c "built without MPI" "$TMP/nompi.err")" -eq 1
    $nompi train "${common[@]}" --steps 3 -o "$TMP/nompi1" 2>/dev/null; rc=$?
    expect "without MPI, alone: trains (got $rc)" test $rc -eq 0
else
    bad "no tlm_nompi next to $TLM"
fi

finish
