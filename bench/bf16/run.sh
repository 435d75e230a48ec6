#!/usr/bin/env bash
# bf16 GEMM candidates (oneDNN, libxsmm, OpenBLAS sbgemm) against fp32 sgemm on the products of a
# training step, and the vdpbf16ps / FMA peaks. Builds bench_bf16 into $BUILD/bench_bf16.
# usage: bench/bf16/run.sh [REPS] [FILTER]
# Env: THREADS (default 2). OPENBLAS_CORETYPE is unset (OpenBLAS's own detection, which prints
# the core it chose here) unless KEEP_CORETYPE=1, e.g.
# KEEP_CORETYPE=1 OPENBLAS_CORETYPE=COOPERLAKE bench/bf16/run.sh to force OpenBLAS's bf16 core.
# Needs libdnnl-dev; libxsmm-dev is optional (its column is 0 without it).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
if [ -z "${KEEP_CORETYPE:-}" ]; then unset OPENBLAS_CORETYPE; fi
mkdir -p "$ROOT/$BUILD"
BIN=$ROOT/$BUILD/bench_bf16
XSMM=()
if [ -f /usr/include/libxsmm.h ]; then XSMM=(-DHAVE_XSMM /usr/lib/libxsmmnoblas.a /usr/lib/libxsmm.a); fi
if [ ! -x "$BIN" ] || [ "$ROOT/bench/bf16/bench_bf16.c" -nt "$BIN" ]; then
    cc -O2 -std=gnu11 -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-openmp \
        "$ROOT/bench/bf16/bench_bf16.c" -o "$BIN" "${XSMM[@]}" -ldnnl -lopenblas -ldl -lm
fi
echo "# $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
OMP_NUM_THREADS=$THREADS "$BIN" "${1:-5}" "${2:-}"
