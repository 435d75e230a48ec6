#!/usr/bin/env bash
# What the tlm program sets in its own environment before it starts again (src/cli/main.c):
# GOMP_SPINCOUNT unless a wait policy was chosen, and OpenBLAS's kernels where OpenBLAS would fall
# back to its SSE3 ones on a CPU with AVX2; a choice the user made is kept. OpenBLAS prints
# "Core: NAME" at each load under OPENBLAS_VERBOSE=2, so each line is one start of the program.
. "$(dirname "$0")/lib.sh"

cores() { # ENV...: the kernels OpenBLAS chose at each start of `tlm info`
    env -u OPENBLAS_CORETYPE -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY OPENBLAS_VERBOSE=2 "$@" \
        "$TLM" info -c "$SRC/configs/demo-char.json" 2>&1 >/dev/null | sed -n 's/^Core: //p'
}

c=($(cores))
expect "tlm info starts twice when nothing is set (got ${#c[@]}: ${c[*]})" test ${#c[@]} -eq 2
if [ "${c[0]}" = Prescott ] && grep -qw avx2 /proc/cpuinfo; then
    expect "OpenBLAS's Prescott fallback on an AVX2 CPU becomes ${c[1]}" \
        grep -Eqx 'Haswell|SkylakeX' <<<"${c[1]}"
else
    expect "OpenBLAS's own choice (${c[0]}) is kept" test "${c[1]}" = "${c[0]}"
fi

c=($(cores OPENBLAS_CORETYPE=Sandybridge))
expect "OPENBLAS_CORETYPE is kept (got ${c[*]})" test "${c[*]}" = "Sandybridge Sandybridge"

c=($(cores OPENBLAS_CORETYPE=Haswell OMP_WAIT_POLICY=passive))
expect "with both chosen, one start (got ${#c[@]}: ${c[*]})" test ${#c[@]} -eq 1

c=($(cores GOMP_SPINCOUNT=100))
if [ "${#c[@]}" -eq 2 ]; then
    expect "a chosen spin count alone: one more start, for OpenBLAS's kernels (${c[*]})" \
        test "${c[0]}" = Prescott
else
    expect "a chosen spin count and OpenBLAS's own choice: one start (${c[*]})" test ${#c[@]} -eq 1
fi
finish
